"""A workload its node agent marked after repeated GPU faults gets a whole GPU for its new pods:
the view reads the node's mark, the webhook rewrites the request, the extender places it alone."""

import json
from typing import Any

import pytest

from gpushare.api.exclusive import ExclusiveWorkload, dump_exclusive
from gpushare.api.names import (
    ANN_EXCLUSIVE,
    ANN_FRACTION,
    ANN_NODE_EXCLUSIVE,
    RESOURCE_GPU_PERCENT,
)
from gpushare.cluster.state import gpu_requests
from gpushare.cluster.state.view import ClusterView
from gpushare.cluster.webhook.facts import ClusterFacts
from gpushare.cluster.webhook.review import review
from tests.fixtures.builders import apply_patch, gpu, node_json, pod_json

MARK = ExclusiveWorkload(
    uid="rs-faulty",
    kind="ReplicaSet",
    namespace="team",
    name="trainer-7d9",
    faults=2,
    since="2026-11-21T10:00:00.000000Z",
    gpu_uuid="G0",
)


def marked_node(marks: list[ExclusiveWorkload] | None) -> dict[str, Any]:
    node = node_json("n0", [gpu("G0"), gpu("G1", index=1)])
    if marks is not None:
        node["metadata"]["annotations"][ANN_NODE_EXCLUSIVE] = dump_exclusive(marks)
    return node


def owned_pod(owner: str, fraction: str = "0.25") -> dict[str, Any]:
    pod = pod_json("trainer-7d9-abcde", namespace="team", fraction=fraction)
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": "x",
            "uid": owner,
            "controller": True,
        }
    ]
    return pod


@pytest.fixture
def view() -> ClusterView:
    view = ClusterView()
    view.replace_nodes([marked_node([MARK])])
    view.replace_pods([])
    return view


def facts(view: ClusterView) -> ClusterFacts:
    return ClusterFacts(exclusive_lookup=view.exclusive_reason)


def test_view_reads_the_marks_and_drops_them_with_the_annotation(view: ClusterView) -> None:
    reason = view.exclusive_reason("rs-faulty")
    assert reason is not None and "2 fatal GPU faults" in reason
    view.upsert_node(marked_node(None))
    assert view.exclusive_reason("rs-faulty") is None


def test_a_broken_mark_annotation_is_ignored_not_fatal(view: ClusterView) -> None:
    node = marked_node(None)
    node["metadata"]["annotations"][ANN_NODE_EXCLUSIVE] = "{not json"
    view.upsert_node(node)
    assert view.node("n0") is not None  # the GPUs stay schedulable


def test_new_pod_of_a_marked_workload_asks_for_a_whole_gpu(view: ClusterView) -> None:
    pod = owned_pod("rs-faulty")
    verdict = review(pod, namespace="team", facts=facts(view), mutate=True)
    assert verdict.allowed, verdict.message
    mutated = apply_patch(pod, verdict.patch)
    assert mutated["metadata"]["annotations"][ANN_FRACTION] == "1"
    assert "fatal GPU faults" in mutated["metadata"]["annotations"][ANN_EXCLUSIVE]
    limits = mutated["spec"]["containers"][0]["resources"]["limits"]
    assert limits[RESOURCE_GPU_PERCENT] == "100"
    assert any("whole GPU" in w for w in verdict.warnings)
    # What the validating webhook then sees passes, and the extender places a whole GPU.
    checked = review(mutated, namespace="team", facts=facts(view), mutate=False)
    assert checked.allowed, checked.message
    demand = gpu_requests.demand_of(mutated)
    assert demand is not None and demand.percent == 100


def test_pods_of_other_workloads_keep_their_share(view: ClusterView) -> None:
    pod = owned_pod("rs-innocent")
    verdict = review(pod, namespace="team", facts=facts(view), mutate=True)
    mutated = apply_patch(pod, verdict.patch)
    assert mutated["metadata"]["annotations"][ANN_FRACTION] == "0.25"
    assert ANN_EXCLUSIVE not in mutated["metadata"]["annotations"]
    assert json.dumps(mutated["spec"]).count('"25"') == 2  # limits and requests


def test_a_pod_of_another_namespace_naming_the_marked_uid_gets_none_of_its_marks(
    view: ClusterView,
) -> None:
    """#45: the API server checks no ownerReference UID; a mark is for its own namespace."""
    pod = owned_pod("rs-faulty")
    pod["metadata"]["namespace"] = "other"
    verdict = review(pod, namespace="other", facts=facts(view), mutate=True)
    mutated = apply_patch(pod, verdict.patch)
    assert mutated["metadata"]["annotations"][ANN_FRACTION] == "0.25"
    assert ANN_EXCLUSIVE not in mutated["metadata"]["annotations"]


def test_a_resource_only_pod_of_a_marked_workload_gets_annotations_too(view: ClusterView) -> None:
    pod = pod_json(
        "p",
        namespace="team",
        containers=[
            {
                "name": "main",
                "image": "busybox",
                "resources": {"limits": {RESOURCE_GPU_PERCENT: "30"}},
            }
        ],
    )
    del pod["metadata"]["annotations"]
    pod["metadata"]["ownerReferences"] = [
        {"kind": "Job", "name": "j", "uid": "rs-faulty", "controller": True}
    ]
    verdict = review(pod, namespace="team", facts=facts(view), mutate=True)
    assert verdict.allowed, verdict.message
    mutated = apply_patch(pod, verdict.patch)
    assert mutated["metadata"]["annotations"][ANN_FRACTION] == "1"
    assert mutated["spec"]["containers"][0]["resources"]["limits"][RESOURCE_GPU_PERCENT] == "100"
