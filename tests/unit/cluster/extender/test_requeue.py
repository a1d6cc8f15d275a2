"""Which refused pods the controller sends back to kube-scheduler's queue."""

from gpushare.cluster.extender.requeue import RefusedPods
from gpushare.cluster.state.pod_facts import PodFacts


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
