"""The chart's admission policies beside other node add-ons, on the local cluster's API server
(issue #66): the default render never refuses another add-on's pod, and still refuses gpushare
pods that mount a protected host directory.

The add-ons' pods are their real pod specs (tests/fixtures/neighbour_pods.yaml: the GPU
Operator's device plugin, dcgm-exporter and container toolkit, kube-prometheus-stack's
node-exporter, fluent-bit), each mounting a protected directory or a parent of one (/ or
/var/log). Every ValidatingAdmissionPolicy of the default render is applied (host paths,
placement annotations, node-agent scope), bound to this module's namespaces (their
``namespaceSelector``) so that other tests never meet them; nothing else of the release. A
gpushare pod reaches the policy without the webhook, which refuses such mounts too.
Server-side dry runs: no pod is created. ``otherPods: deny`` is what NOTES warns about: there
the add-ons are refused outside the exempt namespaces.
"""

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.api.names import ANN_FRACTION, RESOURCE_GPU_PERCENT
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.helm_chart import Chart

pytestmark = pytest.mark.cluster

PODS = Path(__file__).resolve().parents[1] / "fixtures" / "neighbour_pods.yaml"
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
REFUSED = "protected host directory"


@dataclass
class Neighbourhood:
    cluster: LocalCluster
    chart: Chart
    sfx: str
    namespaces: dict[str, str]
    """Kind of namespace (gpu-operator, monitoring, logging, tenant, gpushare) -> its name."""

    def dry_run(self, name: str, namespace: str, spec: dict[str, Any], **meta: Any) -> "Answer":
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, **meta},
            "spec": spec,
        }
        proc = subprocess.run(
            ["kubectl", "create", "--dry-run=server", "-o", "name", "-f", "-"],
            input=json.dumps(pod),
            capture_output=True,
            text=True,
            env=self.cluster.env,
            timeout=60,
            check=False,
        )
        return Answer(admitted=proc.returncode == 0, stderr=proc.stderr)


@dataclass(frozen=True)
class Answer:
    admitted: bool
    stderr: str


def addon_pods(image: str) -> dict[str, dict[str, Any]]:
    """name -> {namespace: kind of namespace, spec}, IMAGE replaced."""
    text = PODS.read_text().replace("IMAGE", image)
    pods: dict[str, dict[str, Any]] = yaml.safe_load(text)
    return pods


SCOPE_LABEL = "gpushare-neighbours-test"


def policies(chart: Chart, release: str, namespace: str, values: dict[str, Any], scope: str) -> str:
    """The chart's admission policies with ``values``, bound to the namespaces labelled
    ``SCOPE_LABEL=scope`` only: cluster-wide, the placement guard refused another module's pod
    update in the moment between their deletion here and the API server dropping them."""
    selector = {"matchLabels": {SCOPE_LABEL: scope}}
    values = {
        **values,
        "placementGuard": {"namespaceSelector": selector},
        "hostPathGuard": {**values.get("hostPathGuard", {}), "namespaceSelector": selector},
    }
    rendered = chart.render(values, release=release, namespace=namespace)
    docs = [o for o in rendered.objects if o["kind"] in POLICY_KINDS]
    assert docs, "the render has no admission policy"
    return "\n---\n".join(yaml.safe_dump(d) for d in docs)


def gpushare_pod(image: str, path: str, **extra: Any) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "command": ["sleep", "3600"],
        "volumeMounts": [{"name": "h", "mountPath": "/h"}],
    }
    container.update(extra.pop("container", {}))
    return {
        "containers": [container],
        "volumes": [{"name": "h", "hostPath": {"path": path}}],
        **extra,
    }


@pytest.fixture(scope="module")
def hood(cluster: LocalCluster, chart: Chart) -> Iterator[Neighbourhood]:
    # A leading letter: a hex suffix such as "68e111" reads as a number in the values file
    # Helm parses, and the chart's schema refuses a label value that is not a string.
    sfx = "n" + uuid.uuid4().hex[:5]
    kinds = ("gpushare", "gpu-operator", "monitoring", "logging", "tenant")
    namespaces = {kind: f"gs-nb-{sfx}-{kind}" for kind in kinds}
    hood = Neighbourhood(cluster, chart, sfx, namespaces)
    # The chart's defaults, bound to this module's namespaces only (policies()).
    applied = policies(chart, f"gsnb{sfx}", namespaces["gpushare"], {}, sfx)
    for name in namespaces.values():
        cluster.kubectl("create", "namespace", name)
        cluster.kubectl("label", "namespace", name, f"{SCOPE_LABEL}={sfx}")
    try:
        cluster.kubectl("apply", "-f", "-", input=applied)
        # A policy takes effect once the API server has read it: wait for the first refusal.
        probe = gpushare_pod(cluster.busybox_image, "/var/lib/kubelet/device-plugins")
        deadline = time.monotonic() + 60
        while hood.dry_run(
            "probe", namespaces["tenant"], probe, annotations={ANN_FRACTION: "0.1"}
        ).admitted:
            assert time.monotonic() < deadline, "the host-path policy never took effect"
            time.sleep(1)
        # The audit (warning) binding is read on its own: wait for its first warning too, or
        # the tests race it (seen once: admitted with no warning right after the refusal).
        plain = gpushare_pod(cluster.busybox_image, "/var/lib/kubelet/device-plugins")
        while "Warning" not in hood.dry_run("probe-plain", namespaces["tenant"], plain).stderr:
            assert time.monotonic() < deadline, "the host-path audit policy never took effect"
            time.sleep(1)
        yield hood
    finally:
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=applied, check=False)
        for name in namespaces.values():
            cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_the_gpu_operator_node_exporter_and_a_log_collector_start_under_the_default_policies(
    hood: Neighbourhood,
) -> None:
    pods = addon_pods(hood.cluster.busybox_image)
    assert len(pods) == 5
    others = f"gsnb{hood.sfx}-gpushare-host-paths-others"  # <release>-gpushare: the fullname
    for name, pod in pods.items():
        answer = hood.dry_run(name, hood.namespaces[pod["namespace"]], pod["spec"])
        assert answer.admitted, f"{name} refused: {answer.stderr}"
        # Audit first: each mounts a protected directory or a parent of one, and its creator
        # is told so (an admin sees which add-ons a stricter setting would stop).
        assert others in answer.stderr and "Warning" in answer.stderr, (name, answer.stderr)


def test_gpushare_pods_mounting_a_protected_directory_are_still_refused(
    hood: Neighbourhood,
) -> None:
    image = hood.cluster.busybox_image
    tenant = hood.namespaces["tenant"]
    asks = {"resources": {"limits": {RESOURCE_GPU_PERCENT: "10"}}}
    cases = {
        "annotated": (gpushare_pod(image, "/run/gpushare/node/mps"), {ANN_FRACTION: "0.25"}),
        "asks-the-resource": (gpushare_pod(image, "/var/lib/kubelet", container=asks), {}),
        "its-scheduler": (
            gpushare_pod(image, "/var//run/./cdi", schedulerName="gpushare-scheduler"),
            {},
        ),
        "init-container-asks": (
            gpushare_pod(
                image,
                "/",
                initContainers=[
                    {"name": "init", "image": image, "command": ["true"], **asks},
                ],
            ),
            {},
        ),
    }
    for name, (spec, annotations) in cases.items():
        answer = hood.dry_run(name, tenant, spec, annotations=annotations)
        assert not answer.admitted, f"gpushare pod {name} admitted"
        assert REFUSED in answer.stderr and "fix:" in answer.stderr, (name, answer.stderr)
    # The same pod without anything of gpushare is no gpushare pod: admitted, with a warning.
    answer = hood.dry_run("plain", tenant, gpushare_pod(image, "/run/gpushare/node/mps"))
    assert answer.admitted and "Warning" in answer.stderr, answer.stderr


def test_other_pods_deny_refuses_the_add_ons_outside_the_exempt_namespaces(
    hood: Neighbourhood,
) -> None:
    """The setting NOTES warns about, as it would act: the GPU Operator's namespace exempt,
    monitoring and logging not."""
    cluster, ns = hood.cluster, hood.namespaces
    values = {"hostPathGuard": {"otherPods": "deny", "exemptNamespaces": [ns["gpu-operator"]]}}
    strict = policies(hood.chart, f"gsnbdeny{hood.sfx}", ns["gpushare"], values, hood.sfx)
    pods = addon_pods(cluster.busybox_image)
    cluster.kubectl("apply", "-f", "-", input=strict)
    try:
        deadline = time.monotonic() + 60
        node_exporter = pods["kube-prometheus-stack-node-exporter"]
        while (answer := hood.dry_run("ne", ns["monitoring"], node_exporter["spec"])).admitted:
            assert time.monotonic() < deadline, "otherPods: deny never took effect"
            time.sleep(1)
        assert "denied request" in answer.stderr, answer.stderr
        assert "host directory gpushare protects" in answer.stderr
        assert "hostPathGuard.exemptNamespaces" in answer.stderr
        refused = {
            name
            for name, pod in pods.items()
            if not hood.dry_run(name, ns[pod["namespace"]], pod["spec"]).admitted
        }
        assert refused == {"kube-prometheus-stack-node-exporter", "fluent-bit"}, refused
    finally:
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=strict, check=False)
