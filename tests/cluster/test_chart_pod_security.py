"""Pod Security Standards on the local cluster's API server (its PodSecurity admission), backing
docs/chart.md "Priority and Pod Security":

- the pods the chart makes for the controller, gpushare-scheduler, the uninstall hook and
  ``helm test`` are admitted in a namespace enforcing ``restricted``, as rendered (critical
  priority class included);
- the node agent's is refused by ``baseline`` (host paths, and privileged with real GPUs): the
  release namespace must be ``privileged``;
- a workload pod that meets ``restricted`` still does after the gpushare webhook mutated it
  (request, scheduler, toleration), so workload namespaces can enforce it.

Server-side dry runs: nothing is created.
"""

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare.api.names import ANN_FRACTION, RESOURCE_GPU_PERCENT
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.controller import ControllerProcess
from tests.fixtures.helm_chart import LOCAL_VALUES, Chart

pytestmark = pytest.mark.cluster

RESTRICTED = {
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "runAsUser": 1000,
}


@pytest.fixture
def namespaces(cluster: LocalCluster) -> Iterator[dict[str, str]]:
    made = {}
    for level in ("restricted", "baseline"):
        name = f"gs-psa-{level}-{uuid.uuid4().hex[:6]}"
        cluster.kubectl("create", "namespace", name)
        cluster.kubectl("label", "namespace", name, f"pod-security.kubernetes.io/enforce={level}")
        made[level] = name
    try:
        yield made
    finally:
        for name in made.values():
            cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def as_pod(name: str, spec: dict[str, Any], namespace: str) -> dict[str, Any]:
    """A workload's pod template as the pod its controller would make (its ServiceAccount
    left out: the test namespace has none of the release's)."""
    spec = {k: v for k, v in spec.items() if k != "serviceAccountName"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def dry_run(cluster: LocalCluster, pod: dict[str, Any]) -> tuple[bool, str]:
    out = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(pod), check=False
    )
    return bool(out.strip()), out


def chart_pods(chart: Chart) -> dict[str, dict[str, Any]]:
    rendered = chart.render(values_files=[LOCAL_VALUES])
    pods = {
        "controller": rendered.get("Deployment", "gpushare-controller"),
        "scheduler": rendered.get("Deployment", "gpushare-scheduler"),
        "uninstall-hook": rendered.get("Job", "gpushare-uninstall"),
        "node-agent": rendered.get("DaemonSet", "gpushare-node-agent"),
    }
    specs = {name: obj["spec"]["template"]["spec"] for name, obj in pods.items()}
    specs["helm-test"] = rendered.get("Pod", "gpushare-test-share")["spec"]
    return specs


def test_the_control_plane_pods_meet_restricted_and_the_agent_needs_privileged(
    cluster: LocalCluster, chart: Chart, namespaces: dict[str, str]
) -> None:
    specs = chart_pods(chart)
    assert specs["controller"]["priorityClassName"] == "system-cluster-critical"
    refused = {}
    for name, spec in specs.items():
        ok, out = dry_run(cluster, as_pod(f"psa-{name}", spec, namespaces["restricted"]))
        if not ok:
            refused[name] = out
    assert set(refused) == {"node-agent"}, refused
    ok, _ = dry_run(cluster, as_pod("psa-agent", specs["node-agent"], namespaces["baseline"]))
    assert not ok, "the node agent needs a privileged namespace (host paths)"


def test_a_restricted_workload_stays_restricted_after_the_webhook(
    cluster: LocalCluster, controller: ControllerProcess, namespaces: dict[str, str]
) -> None:
    namespace = namespaces["restricted"]
    cluster.kubectl("label", "namespace", namespace, controller.namespace_label)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "restricted-share",
            "namespace": namespace,
            "annotations": {ANN_FRACTION: "0.25"},
        },
        "spec": {
            "securityContext": RESTRICTED,
            "containers": [
                {
                    "name": "main",
                    "image": cluster.busybox_image,
                    "command": ["sleep", "3600"],
                    "securityContext": CONTAINER_RESTRICTED,
                }
            ],
        },
    }
    ok, out = dry_run(cluster, pod)
    assert ok, "the mutated pod was refused"
    mutated = json.loads(out)
    limits = mutated["spec"]["containers"][0]["resources"]["limits"]
    assert limits[RESOURCE_GPU_PERCENT] == "25"
    assert mutated["spec"]["schedulerName"] == "gpushare-scheduler"
