"""The preempt verb: kube-scheduler's priority preemption goes ahead only where evicting its
victims makes room on one GPU (docs/scheduling.md, "Preemption")."""

from datetime import UTC, datetime
from typing import Any

import pytest

from gpushare.api.names import RESOURCE_GPU_OPPORTUNISTIC, RESOURCE_GPU_PERCENT, STATE_ALLOCATED
from gpushare.api.placement import Placement
from gpushare.cluster.extender.args import BadRequestError, parse_preemption_args
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.state.view import ClusterView
from tests.fixtures.builders import GIB, gpu, node_json, pod_json

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def asking(resource: str, percent: int) -> list[dict[str, Any]]:
    return [{"name": "main", "image": "busybox", "resources": {"limits": {resource: str(percent)}}}]


def tenant(name: str, uuid: str, percent: int, *, opted_in: bool = False) -> dict[str, Any]:
    resource = RESOURCE_GPU_OPPORTUNISTIC if opted_in else RESOURCE_GPU_PERCENT
    return pod_json(
        name,
        node="two",
        phase="Running",
        placement=Placement((uuid,), percent, 8 * GIB, NOW, STATE_ALLOCATED),
        containers=asking(resource, percent),
    )


def extender(*, opted_in: bool = False) -> Extender:
    """Node two: GPU T0 holds a (60%), GPU T1 holds b and c (30% each): 80% free in total, at
    most 40% on one GPU. Node one: one GPU, d at 50%."""
    view = ClusterView(clock=lambda: NOW)
    view.replace_nodes(
        [node_json("two", [gpu("T0"), gpu("T1", index=1)]), node_json("one", [gpu("O0")])]
    )
    view.replace_pods(
        [
            tenant("a", "T0", 60),
            tenant("b", "T1", 30, opted_in=opted_in),
            tenant("c", "T1", 30),
            pod_json(
                "d",
                node="one",
                phase="Running",
                placement=Placement(("O0",), 50, 8 * GIB, NOW, STATE_ALLOCATED),
                containers=asking(RESOURCE_GPU_PERCENT, 50),
            ),
        ]
    )
    return Extender(view=view, writer=None)


def preempt(
    ext: Extender, pod: dict[str, Any], victims: dict[str, list[str]]
) -> dict[str, list[str]]:
    """Node -> victim pod names kept, for victims given by pod name (UIDs on the wire)."""
    doc = {
        "Pod": pod,
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": f"uid-default-{n}"} for n in names], "NumPDBViolations": 0}
            for node, names in victims.items()
        },
    }
    result = ext.preempt(parse_preemption_args(doc))
    assert set(result) == {"NodeNameToMetaVictims"}
    return {
        node: [p["UID"].removeprefix("uid-default-") for p in kept["Pods"]]
        for node, kept in result["NodeNameToMetaVictims"].items()
    }


def test_victims_that_leave_no_gpu_with_room_are_not_evicted() -> None:
    """kube-scheduler counts the node's total: evicting c leaves 110% free on node two, enough
    for 90% in total, but no GPU has 90% free (T0 40%, T1 70%)."""
    pod = pod_json("p", containers=asking(RESOURCE_GPU_PERCENT, 90))
    assert preempt(extender(), pod, {"two": ["c"]}) == {}


def test_victims_that_free_one_gpu_are_evicted_as_kube_scheduler_chose() -> None:
    pod = pod_json("p", containers=asking(RESOURCE_GPU_PERCENT, 90))
    kept = preempt(extender(), pod, {"two": ["b", "c"], "one": ["d"]})
    assert kept == {"two": ["b", "c"], "one": ["d"]}
    assert preempt(extender(), pod, {"two": ["a"]}) == {"two": ["a"]}


def test_an_opted_in_pod_evicts_no_opted_in_pod() -> None:
    """No preemption among equals, even where evicting would make room."""
    opted = pod_json(
        "p",
        annotations={"gpushare.io/opportunistic": "true"},
        containers=asking(RESOURCE_GPU_OPPORTUNISTIC, 90),
    )
    assert preempt(extender(opted_in=True), opted, {"two": ["b", "c"]}) == {}
    # A guaranteed pod may; so may the opted-in pod where its victims are not opted in.
    guaranteed = pod_json("p", containers=asking(RESOURCE_GPU_PERCENT, 90))
    assert preempt(extender(opted_in=True), guaranteed, {"two": ["b", "c"]}) == {"two": ["b", "c"]}
    assert preempt(extender(opted_in=True), opted, {"two": ["a"]}) == {"two": ["a"]}


def test_pods_without_gpus_keep_the_victims_kube_scheduler_chose() -> None:
    """kube-scheduler's own fit is exact for CPU and memory."""
    assert preempt(extender(), pod_json("cpu"), {"two": ["c"]}) == {"two": ["c"]}


def test_a_node_the_view_does_not_know_is_dropped() -> None:
    pod = pod_json("p", containers=asking(RESOURCE_GPU_PERCENT, 20))
    assert preempt(extender(), pod, {"ghost": ["x"], "one": ["d"]}) == {"one": ["d"]}


def test_full_victims_as_a_cache_less_scheduler_sends_them_are_read_by_uid() -> None:
    doc = {
        "Pod": pod_json("p", containers=asking(RESOURCE_GPU_PERCENT, 90)),
        "NodeNameToVictims": {"two": {"Pods": [pod_json("a")], "NumPDBViolations": 1}},
    }
    result = extender().preempt(parse_preemption_args(doc))
    assert result == {
        "NodeNameToMetaVictims": {
            "two": {"Pods": [{"UID": "uid-default-a"}], "NumPDBViolations": 1}
        }
    }


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ([], "ExtenderPreemptionArgs object"),
        ({"Pod": {"metadata": {"name": "p"}}}, "NodeNameToMetaVictims or NodeNameToVictims"),
        ({"Pod": {"metadata": {"name": "p"}}, "NodeNameToMetaVictims": []}, "must be an object"),
        (
            {"Pod": {"metadata": {"name": "p"}}, "NodeNameToMetaVictims": {"n": {"Pods": [{}]}}},
            "NodeNameToMetaVictims['n'].Pods[0].UID must be a string",
        ),
        (
            {
                "Pod": {"metadata": {"name": "p"}},
                "NodeNameToMetaVictims": {"n": {"Pods": [], "NumPDBViolations": -1}},
            },
            "NumPDBViolations must be a count",
        ),
        ({"Pod": 3, "NodeNameToMetaVictims": {}}, "Pod must be an object"),
    ],
)
def test_malformed_preemption_args_are_refused_naming_the_key(doc: object, words: str) -> None:
    with pytest.raises(BadRequestError, match=words.replace("[", r"\[").replace("]", r"\]")):
        parse_preemption_args(doc)
