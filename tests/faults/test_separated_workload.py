"""A workload its node agent moved away after it kept faulting together with a neighbour: the
view reads the node's list, the webhook keeps the workload's new pods off the GPU where they
faulted (``gpushare.io/avoid-gpus``), and the extender's placement honours it -- on a node with
one GPU the pod is refused there with a reason instead of meeting its partner again."""

from typing import Any

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.api.exclusive import ExclusiveWorkload, dump_exclusive, parse_avoid_gpus
from gpushare.api.names import ANN_AVOID_GPUS, ANN_FRACTION, ANN_NODE_SEPARATED
from gpushare.cluster.state import gpu_requests
from gpushare.cluster.state.view import ClusterView
from gpushare.cluster.webhook.facts import ClusterFacts
from gpushare.cluster.webhook.review import review
from gpushare.packing.fit import node_fit_reason
from gpushare.packing.model import GpuState, NodeState
from gpushare.packing.policy import choose_gpus
from tests.faults import test_exclusive_gpu as exclusive_case
from tests.fixtures.builders import apply_patch, gpu, node_json, pod_json

FAULTED = "GPU-11111111-2222-3333-4444-555555555555"
OTHER = "GPU-66666666-7777-8888-9999-000000000000"
MOVED = ExclusiveWorkload(
    uid="rs-trainer",
    kind="ReplicaSet",
    namespace="team",
    name="trainer-7d9",
    faults=2,
    since="2026-11-21T10:00:00.000000Z",
    gpu_uuid=FAULTED,
)


def node_with(marks: list[ExclusiveWorkload] | None) -> dict[str, Any]:
    node = node_json("n0", [gpu(FAULTED), gpu(OTHER, index=1)])
    if marks is not None:
        node["metadata"]["annotations"][ANN_NODE_SEPARATED] = dump_exclusive(marks)
    return node


def owned_pod(owner: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    pod = exclusive_case.owned_pod(owner)
    pod["metadata"]["annotations"].update(annotations or {})
    return pod


@pytest.fixture
def view() -> ClusterView:
    view = ClusterView()
    view.replace_nodes([node_with([MOVED])])
    view.replace_pods([])
    return view


def facts(view: ClusterView) -> ClusterFacts:
    return ClusterFacts(separation_lookup=view.separation)


def test_view_reads_the_separation_and_drops_it_with_the_annotation(view: ClusterView) -> None:
    found = view.separation("rs-trainer")
    assert found is not None
    assert found[0] == frozenset({FAULTED})
    assert "ReplicaSet team/trainer-7d9" in found[1]
    view.upsert_node(node_with(None))
    assert view.separation("rs-trainer") is None
    assert view.separation("rs-other") is None


def test_a_separated_workloads_new_pod_is_kept_off_the_gpu_where_it_faulted(
    view: ClusterView,
) -> None:
    pod = owned_pod("rs-trainer")
    verdict = review(pod, namespace="team", facts=facts(view), mutate=True)
    assert verdict.allowed, verdict.message
    mutated = apply_patch(pod, verdict.patch)
    assert mutated["metadata"]["annotations"][ANN_AVOID_GPUS] == FAULTED
    assert mutated["metadata"]["annotations"][ANN_FRACTION] == "0.25"  # its share is unchanged
    assert any(FAULTED in w and "kept off" in w for w in verdict.warnings)
    checked = review(mutated, namespace="team", facts=facts(view), mutate=False)
    assert checked.allowed, checked.message
    # The extender's placement: the other GPU on a two-GPU node, nothing on a one-GPU node.
    demand = gpu_requests.demand_of(mutated)
    assert demand is not None and demand.avoid_gpus == frozenset({FAULTED})
    both = NodeState(
        name="n0",
        gpus=[
            GpuState(uuid=FAULTED, memory_bytes=80 << 30),
            GpuState(uuid=OTHER, memory_bytes=80 << 30),
        ],
    )
    chosen = choose_gpus(both, demand)
    assert chosen is not None and chosen.gpu_uuids == (OTHER,)
    alone = NodeState(name="n1", gpus=[GpuState(uuid=FAULTED, memory_bytes=80 << 30)])
    assert choose_gpus(alone, demand) is None
    reason = node_fit_reason(alone, demand)
    assert reason is not None and f"avoids GPU {FAULTED}" in reason


def test_pods_of_other_workloads_and_bare_pods_are_unchanged(view: ClusterView) -> None:
    for pod in (owned_pod("rs-innocent"), pod_json("bare", namespace="team", fraction="0.25")):
        verdict = review(pod, namespace="team", facts=facts(view), mutate=True)
        assert verdict.allowed, verdict.message
        assert ANN_AVOID_GPUS not in apply_patch(pod, verdict.patch)["metadata"]["annotations"]
        assert verdict.warnings == ()


def test_a_users_own_avoid_list_is_kept_and_merged(view: ClusterView) -> None:
    pod = owned_pod("rs-trainer", {ANN_AVOID_GPUS: OTHER})
    verdict = review(pod, namespace="team", facts=facts(view), mutate=True)
    assert verdict.allowed, verdict.message
    mutated = apply_patch(pod, verdict.patch)
    assert parse_avoid_gpus(mutated["metadata"]["annotations"][ANN_AVOID_GPUS]) == {
        FAULTED,
        OTHER,
    }


def test_a_malformed_avoid_list_is_refused_naming_the_annotation(view: ClusterView) -> None:
    pod = owned_pod("rs-innocent", {ANN_AVOID_GPUS: f"{OTHER}, 0"})
    verdict = review(pod, namespace="team", facts=facts(view), mutate=True)
    assert not verdict.allowed
    assert ANN_AVOID_GPUS in verdict.message and "'0' is not a GPU UUID" in verdict.message
    with pytest.raises(InvalidInputError, match="nvidia-smi -L"):
        parse_avoid_gpus("GPU-x y")
    assert parse_avoid_gpus(None) == frozenset() and parse_avoid_gpus(" ") == frozenset()


def test_in_dra_mode_the_separated_workloads_pod_gets_its_claim_and_the_avoid_list(
    view: ClusterView,
) -> None:
    """DRA mode (docs/dra.md): the same annotation beside the claim the webhook makes; the
    controller's claim allocator honours it (tests/unit/cluster/dra/test_allocator.py)."""
    pod = owned_pod("rs-trainer")
    dra_facts = ClusterFacts(
        separation_lookup=view.separation, dra_device_class="mps.gpushare.io", dra_gate=True
    )
    verdict = review(pod, namespace="team", facts=dra_facts, mutate=True)
    assert verdict.allowed, verdict.message
    mutated = apply_patch(pod, verdict.patch)
    assert mutated["metadata"]["annotations"][ANN_AVOID_GPUS] == FAULTED
    assert mutated["spec"]["resourceClaims"], "the pod got its claim"
    assert any(FAULTED in w and "kept off" in w for w in verdict.warnings)
    assert review(mutated, namespace="team", facts=dra_facts, mutate=False).allowed
