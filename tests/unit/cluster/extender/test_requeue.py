"""Which refused pods the controller sends back to kube-scheduler's queue, and which wait
for room the promotion round leaves them."""

from dataclasses import replace
from datetime import UTC, datetime

from gpushare.cluster.extender.requeue import MAX_WAITING_NODES, RefusedPods
from gpushare.cluster.state.pod_facts import PodFacts, Workload
from gpushare.packing.model import Demand


def facts(key: str, *, node: str | None = None, finished: bool = False) -> PodFacts:
    return PodFacts(
        key=key, uid=f"uid-{key}", node=node, finished=finished, demand=None, placement=None
    )


def test_only_refused_pods_still_waiting_for_a_node_are_retried() -> None:
    refused = RefusedPods()
    for key in ("ns/waiting", "ns/bound", "ns/done", "ns/gone", "ns/placed"):
        refused.refused(key)
    refused.placed("ns/placed")  # a later filter found it a node
    pods = {
        "ns/waiting": facts("ns/waiting"),
        "ns/bound": facts("ns/bound", node="n1"),
        "ns/done": facts("ns/done", finished=True),
        "ns/placed": facts("ns/placed"),
    }
    assert refused.take(pods) == ["ns/waiting"]
    assert refused.take(pods) == []  # each refusal is retried once


def test_the_oldest_refusals_are_forgotten_beyond_the_limit() -> None:
    refused = RefusedPods(limit=2)
    for i, key in enumerate(("ns/a", "ns/b", "ns/c")):
        refused.refused(key, now=float(i))
    refused.refused("ns/b", now=3.0)  # refused again: now the newest
    assert len(refused) == 2
    assert refused.take({k: facts(k) for k in ("ns/a", "ns/b", "ns/c")}) == ["ns/c", "ns/b"]


def test_pods_refused_for_room_wait_on_the_nodes_that_lacked_it_until_bound() -> None:
    """What the promotion round leaves room for (``RefusedPods.waiting``): pods refused where
    room alone stood in the way, on those nodes, since their creation; kept across a retry
    nudge, forgotten once bound, finished, gone or placed."""
    refused = RefusedPods()
    ask = Demand(percent=50)
    refused.refused("ns/here", demand=ask, nodes=["n1"])
    refused.refused(
        "ns/anywhere", demand=ask, nodes=[f"n{i}" for i in range(MAX_WAITING_NODES + 1)]
    )
    refused.refused("ns/rules", demand=None)  # refused for what no room cures
    refused.refused("ns/bound", demand=ask, nodes=["n1"])
    refused.refused("ns/placed", demand=ask, nodes=["n1"])
    refused.placed("ns/placed")
    created = datetime(2026, 1, 1, tzinfo=UTC)
    pods = {
        k: replace(facts(k), workload=Workload(created=created))
        for k in ("ns/here", "ns/anywhere", "ns/rules", "ns/placed")
    }
    pods["ns/bound"] = facts("ns/bound", node="n1")
    refused.take(pods)  # the nudge does not end the wait
    waiting = refused.waiting(pods).on("n1")
    assert sorted(w.key for w in waiting) == ["ns/anywhere", "ns/here"]
    assert {w.since for w in waiting} == {created.timestamp()}
    assert [w.key for w in refused.waiting(pods).on("n2")] == ["ns/anywhere"]
    pods["ns/here"] = facts("ns/here", node="n1")
    assert [w.key for w in refused.waiting(pods).on("n1")] == ["ns/anywhere"]
