"""gpushare places DRA claims (``--dra-placement=gpushare``, the default in DRA mode), on the
DRA-mode local cluster with the agent's two simulated GPUs.

The webhook gates each annotated pod; the controller allocates its claim with gpushare's placer
and removes the gate; kube-scheduler only binds the pod. What a user sees that first fit would
not give: a second namespace's pod starts on the free GPU instead of waiting off the GPU that
serves the first namespace (compare test_dra_tenancy.py, where kube-scheduler allocates), and a
pod with no room yet waits gated with an event saying why, then starts once room frees
(docs/dra.md, "Who places a claim").
"""

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare.api.dra import PLACEMENT_GATE
from gpushare.api.names import ANN_FRACTION
from tests.cluster.dra.test_dra_annotations import annotated_pod
from tests.fixtures.chart_release import wait_for
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.controller import ControllerProcess
from tests.fixtures.dra import container_env, release_pods

pytestmark = pytest.mark.cluster

Obj = dict[str, Any]


@pytest.fixture
def webhook_namespaces(
    dra_cluster: LocalCluster, dra_controller: ControllerProcess
) -> Iterator[list[str]]:
    """Two namespaces (two tenancies) whose pods go through the DRA-mode webhook."""
    suffix = uuid.uuid4().hex[:6]
    names = [f"place-a-{suffix}", f"place-b-{suffix}"]
    for ns in names:
        dra_cluster.kubectl("create", "namespace", ns)
        dra_cluster.kubectl("label", "namespace", ns, dra_controller.namespace_label)
    yield names
    for ns in names:
        release_pods(dra_cluster, ns)
        dra_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def pod(c: LocalCluster, ns: str, name: str) -> Obj:
    got: Obj = json.loads(c.kubectl("get", "pod", name, "-n", ns, "-o", "json"))
    return got


def wait_running(c: LocalCluster, ns: str, name: str, *, timeout_s: float = 90) -> Obj:
    def running() -> Obj | None:
        p = pod(c, ns, name)
        return p if p["status"].get("phase") == "Running" else None

    try:
        got: Obj = wait_for(running, timeout_s=timeout_s, what=f"{ns}/{name} Running", every_s=0.5)
    except AssertionError:
        events = c.kubectl("get", "events", "-n", ns)
        raise AssertionError(f"{ns}/{name} not Running:\n{events}") from None
    return got


def claim_of(c: LocalCluster, ns: str, name: str) -> Obj:
    (status,) = pod(c, ns, name)["status"]["resourceClaimStatuses"]
    got: Obj = json.loads(
        c.kubectl("get", "resourceclaim", status["resourceClaimName"], "-n", ns, "-o", "json")
    )
    return got


def device_of(claim: Obj) -> str:
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def status_writers(claim: Obj) -> set[str]:
    """Who wrote the claim's status (its managed fields): the allocation's author."""
    return {
        str(m.get("manager"))
        for m in claim["metadata"].get("managedFields", [])
        if m.get("subresource") == "status"
    }


def create(c: LocalCluster, ns: str, name: str, fraction: str) -> None:
    body = annotated_pod(c, name, {ANN_FRACTION: fraction})
    c.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(body))


def test_a_second_namespace_starts_on_the_free_gpu(
    dra_cluster: LocalCluster, dra_agent: list[Obj], webhook_namespaces: list[str]
) -> None:
    c = dra_cluster
    a, b = webhook_namespaces
    dry = json.loads(
        c.kubectl(
            "create", "--dry-run=server", "-o", "json", "-n", a, "-f", "-",
            input=json.dumps(annotated_pod(c, "job", {ANN_FRACTION: "0.2"})),
        )
    )  # fmt: skip
    assert dry["spec"]["schedulingGates"] == [{"name": PLACEMENT_GATE}]

    create(c, a, "job", "0.2")
    wait_running(c, a, "job")
    create(c, b, "job", "0.2")
    wait_running(c, b, "job")

    first, second = claim_of(c, a, "job"), claim_of(c, b, "job")
    # Different tenancies never share a GPU: b's claim went to the other GPU, where kube-
    # scheduler's first fit would have put it beside a's (and the agent would refuse it).
    assert device_of(first) != device_of(second)
    for claim in (first, second):
        assert "kube-scheduler" not in status_writers(claim)
        assert claim["status"]["reservedFor"][0]["resource"] == "pods"
    uuids = {
        d["name"]: d["attributes"]["uuid"]["string"]
        for s in dra_agent
        for d in s["spec"]["devices"]
    }
    assert container_env(c, b, "job")["CUDA_VISIBLE_DEVICES"] == uuids[device_of(second)]
    # The gate went with a pin to the claim's node, which the API server took (it refuses a
    # pin it would not allow, and the controller then removes the gate without one).
    placed = pod(c, b, "job")
    terms = placed["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    node = placed["spec"]["nodeName"]
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    ]


def test_a_claim_without_room_waits_gated_then_starts_when_room_frees(
    dra_cluster: LocalCluster, dra_agent: list[Obj], webhook_namespaces: list[str]
) -> None:
    c = dra_cluster
    ns = webhook_namespaces[0]
    create(c, ns, "big-1", "0.8")
    create(c, ns, "big-2", "0.8")
    wait_running(c, ns, "big-1")
    wait_running(c, ns, "big-2")
    assert device_of(claim_of(c, ns, "big-1")) != device_of(claim_of(c, ns, "big-2"))

    create(c, ns, "late", "0.5")

    def told() -> str | None:
        events = c.kubectl(
            "get", "events", "-n", ns, "--field-selector",
            "involvedObject.name=late,reason=GpushareNoRoom", "-o", "json",
        )  # fmt: skip
        items = json.loads(events)["items"]
        return str(items[0]["message"]) if items else None

    message = wait_for(told, timeout_s=30, what="the no-room event of the late pod", every_s=0.5)
    assert "fits no GPU yet" in message
    late = pod(c, ns, "late")
    assert late["spec"]["schedulingGates"] == [{"name": PLACEMENT_GATE}]
    assert "nodeName" not in late["spec"]

    freed = device_of(claim_of(c, ns, "big-1"))
    c.kubectl("delete", "pod", "big-1", "-n", ns, "--wait=true", "--timeout=60s")
    wait_running(c, ns, "late")
    assert device_of(claim_of(c, ns, "late")) == freed
