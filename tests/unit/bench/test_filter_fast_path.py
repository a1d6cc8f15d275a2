"""The filter's per-shape node costs (gpushare.cluster.extender.answers.ShapeCosts) against
working every cost out afresh: the same node held for every pod, on a synthetic cluster and on
every openb pod list when the traces are at hand (issue 47: the fast path and the reference
never disagree silently)."""

import random
from pathlib import Path

import pytest

from bench.extender import openb_filter
from bench.sim.trace import NodeSpec, PodSpec, load_nodes, load_pods, pod_lists
from gpushare.cluster.extender import answers

TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces" / "openb"


def _without_shape_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every filter call starts from no remembered node cost (the reference path)."""
    monkeypatch.setattr(answers.ShapeCosts, "costs", lambda self, demand: {})


def _replay(nodes: list[NodeSpec], pods: list[PodSpec], limit: int) -> tuple[list[str], float]:
    chosen: list[str] = []
    result = openb_filter.run(nodes, pods, seed=7, ratio=1.3, limit=limit, chosen_nodes=chosen)
    return chosen, float(result["alloc_percent"])


def _synthetic() -> tuple[list[NodeSpec], list[PodSpec]]:
    rng = random.Random(47)
    nodes = [
        NodeSpec(f"node-{i:03d}", 64000, 262144, rng.choice((2, 4, 8)), rng.choice(("A100", "T4")))
        for i in range(40)
    ]
    pods = []
    for i in range(300):
        whole = rng.random() < 0.2
        pods.append(
            PodSpec(
                name=f"pod-{i:04d}",
                cpu_milli=rng.choice((0, 2000, 4000, 8000, 16000)),
                memory_mib=rng.choice((0, 4096, 16384, 65536)),
                num_gpu=rng.choice((1, 2)) if whole else rng.choice((0, 1, 1, 1)),
                percent=100 if whole else rng.choice((5, 10, 25, 30, 50, 75)),
                gpu_spec=rng.choice(("", "", "T4")),
                qos=rng.choice(("LS", "BE")),
            )
        )
    return nodes, pods


def test_remembered_node_costs_place_every_pod_where_fresh_costs_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes, pods = _synthetic()
    fast, fast_alloc = _replay(nodes, pods, 300)
    with monkeypatch.context() as m:
        _without_shape_costs(m)
        reference, reference_alloc = _replay(nodes, pods, 300)
    assert fast == reference
    assert fast_alloc == reference_alloc
    assert sum(1 for n in fast if n) > 100  # the cluster took pods, not only refusals


@pytest.mark.parametrize("trace", ["default", "gpushare40", "multigpu20", "gpuspec33", "cpu050"])
def test_remembered_node_costs_agree_with_fresh_ones_on_openb_lists(
    monkeypatch: pytest.MonkeyPatch, trace: str
) -> None:
    if not TRACES.is_dir():
        pytest.skip(f"openb traces not found at {TRACES} (they are not part of the repository)")
    lists = pod_lists(TRACES)
    if trace not in lists:
        pytest.skip(f"openb pod list {trace!r} not found in {TRACES}")
    nodes = load_nodes(TRACES / "openb_node_list_gpu_node.csv")
    pods = load_pods(lists[trace])
    fast, fast_alloc = _replay(nodes, pods, 800)
    with monkeypatch.context() as m:
        _without_shape_costs(m)
        reference, reference_alloc = _replay(nodes, pods, 800)
    assert fast == reference and fast_alloc == reference_alloc
