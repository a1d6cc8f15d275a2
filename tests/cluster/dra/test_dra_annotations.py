"""Users who keep annotations, in DRA mode: the controller's webhook (``--annotation-mode=dra``)
turns ``gpushare.io/gpu-fraction`` into a ResourceClaim from a template the controller makes in
the pod's namespace once the pod is stored, the claim is allocated from the agent's slice, and
the container starts with its share. A template forged under gpushare's name is refused, not
used or overwritten.
"""

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare.api.dra import POD_CLAIM
from gpushare.api.names import ANN_FRACTION, ANN_LIMIT, ANN_MEMORY
from tests.fixtures.chart_release import wait_for
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.controller import ControllerProcess
from tests.fixtures.dra import SHOW_ENV, container_env, release_pods

pytestmark = pytest.mark.cluster

Obj = dict[str, Any]


def annotated_pod(c: LocalCluster, name: str, annotations: dict[str, str]) -> Obj:
    """A pod as a user of annotations writes it: no claim, no resources."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": c.busybox_image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", SHOW_ENV],
                }
            ],
        },
    }


def templates(c: LocalCluster, ns: str) -> dict[str, Obj]:
    out = json.loads(c.kubectl("get", "resourceclaimtemplates", "-n", ns, "-o", "json"))
    return {t["metadata"]["name"]: t for t in out["items"]}


@pytest.fixture
def namespace(dra_cluster: LocalCluster, dra_controller: ControllerProcess) -> Iterator[str]:
    """A namespace whose pods go through the DRA-mode controller's webhook."""
    ns = f"dra-ann-{uuid.uuid4().hex[:6]}"
    dra_cluster.kubectl("create", "namespace", ns)
    dra_cluster.kubectl("label", "namespace", ns, dra_controller.namespace_label)
    yield ns
    release_pods(dra_cluster, ns)
    dra_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_an_annotated_pod_gets_a_claim_and_starts_with_its_share(
    dra_cluster: LocalCluster, dra_agent: list[Obj], namespace: str
) -> None:
    c, ns = dra_cluster, namespace
    asked = {ANN_FRACTION: "0.3", ANN_MEMORY: "4Gi", ANN_LIMIT: "0.45"}
    pod = annotated_pod(c, "job", asked)

    # A server-side dry run shows the mutation and makes nothing.
    dry = json.loads(
        c.kubectl(
            "create", "--dry-run=server", "-o", "json", "-n", ns, "-f", "-",
            input=json.dumps(pod),
        )
    )  # fmt: skip
    assert dry["spec"]["resourceClaims"] == [
        {"name": POD_CLAIM, "resourceClaimTemplateName": "gpushare-30pct-4gi-limit45"}
    ]
    assert templates(c, ns) == {}

    c.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(pod))
    made = wait_for(
        lambda: templates(c, ns), timeout_s=30, what="the pod's claim template", every_s=0.2
    )
    assert list(made) == ["gpushare-30pct-4gi-limit45"]

    def running() -> bool:
        p = json.loads(c.kubectl("get", "pod", "job", "-n", ns, "-o", "json"))
        return bool(p["status"].get("phase") == "Running")

    try:
        wait_for(running, timeout_s=90, what="the annotated pod Running", every_s=0.5)
    except AssertionError:
        raise AssertionError(f"pod not Running:\n{c.kubectl('get', 'events', '-n', ns)}") from None
    live = json.loads(c.kubectl("get", "pod", "job", "-n", ns, "-o", "json"))
    (status,) = live["status"]["resourceClaimStatuses"]
    claim = json.loads(
        c.kubectl("get", "resourceclaim", status["resourceClaimName"], "-n", ns, "-o", "json")
    )
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["consumedCapacity"] == {"gpuPercent": "30", "memory": "4Gi"}
    device = next(
        d for s in dra_agent for d in s["spec"]["devices"] if d["name"] == result["device"]
    )
    env = container_env(c, ns, "job")
    assert env["CUDA_VISIBLE_DEVICES"] == device["attributes"]["uuid"]["string"]
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "45"  # its gpushare.io/gpu-limit
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].endswith("=4096M")

    # A second pod of the same request reuses the template.
    c.kubectl(
        "create", "-n", ns, "-f", "-",
        input=json.dumps(annotated_pod(c, "job2", asked)),
    )  # fmt: skip
    assert list(templates(c, ns)) == ["gpushare-30pct-4gi-limit45"]


def test_a_forged_template_under_gpushares_name_is_refused(
    dra_cluster: LocalCluster, namespace: str
) -> None:
    c, ns = dra_cluster, namespace
    forged = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpushare-40pct"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "mps.gpushare.io",
            "capacity": {"requests": {"gpuPercent": "100"}},
        }}]}}},
    }  # fmt: skip
    c.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(forged))
    before = templates(c, ns)["gpushare-40pct"]["spec"]
    refusal = _create_error(c, ns, annotated_pod(c, "greedy", {ANN_FRACTION: "0.4"}))
    assert f"ResourceClaimTemplate {ns}/gpushare-40pct" in refusal
    assert "kubectl delete resourceclaimtemplate" in refusal
    assert templates(c, ns)["gpushare-40pct"]["spec"] == before
    assert json.loads(c.kubectl("get", "pods", "-n", ns, "-o", "json"))["items"] == []


def _create_error(c: LocalCluster, ns: str, pod: Obj) -> str:
    try:
        c.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(pod))
    except AssertionError as exc:
        return str(exc)
    raise AssertionError("the pod was admitted")
