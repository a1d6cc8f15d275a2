"""The filter's fast paths -- per-shape node costs (gpushare.cluster.extender.answers.ShapeCosts)
and the placer's quick costs and refusals from facts kept per node state
(gpushare.packing.quick_costs) -- against the reference, every answer worked out by
Placer.node_cost and Placer.refusal: the same answer to every filter call (the node held, or
every node's reason where none fits), and the same GPUs bound, on a synthetic cluster and on
every openb pod list when the traces are at hand (issue 47: the fast path and the reference
never disagree silently)."""

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from bench.extender import openb_filter, scale_flow
from bench.sim.trace import NodeSpec, PodSpec, load_nodes, load_pods, pod_lists
from gpushare.cluster.extender import answers
from gpushare.packing.placer import Placer

TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces" / "openb"


def _without_shape_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every filter call starts from no remembered node cost and asks Placer.node_cost (the
    reference path)."""
    monkeypatch.setattr(answers.ShapeCosts, "costs", lambda self, demand: {})
    monkeypatch.setattr(Placer, "quick_reads", lambda self, demand: False)


def _replay(
    nodes: list[NodeSpec], pods: list[PodSpec], limit: int
) -> tuple[list[dict[str, Any]], float]:
    """Every filter answer (the node held, or every node's reason where none fits) and the
    allocation reached."""
    answers: list[dict[str, Any]] = []
    result = openb_filter.run(nodes, pods, seed=7, ratio=1.3, limit=limit, answers=answers)
    return answers, float(result["alloc_percent"])


def _synthetic() -> tuple[list[NodeSpec], list[PodSpec]]:
    rng = random.Random(47)
    nodes = [
        NodeSpec(f"node-{i:03d}", 64000, 262144, rng.choice((2, 4, 8)), rng.choice(("A100", "T4")))
        for i in range(16)
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
    held = sum(1 for a in fast if a["NodeNames"])
    assert 100 < held < len(fast)  # nodes held, and refusals with their reasons compared


@pytest.mark.parametrize("trace", ["default", "gpushare40", "multigpu20", "gpuspec33", "cpu050"])
def test_remembered_node_costs_agree_with_fresh_ones_on_openb_lists(
    monkeypatch: pytest.MonkeyPatch, trace: str
) -> None:
    if not TRACES.is_dir():
        pytest.skip(f"openb traces not found at {TRACES} (they are not part of the repository)")
    lists = pod_lists(TRACES)
    if trace not in lists:
        pytest.skip(f"openb pod list {trace!r} not found in {TRACES}")
    # A twentieth of the trace's nodes: 800 arrivals fill them, so refusals (with every node's
    # reason) are compared too, not only the nodes held.
    nodes = load_nodes(TRACES / "openb_node_list_gpu_node.csv")[::20]
    pods = load_pods(lists[trace])
    fast, fast_alloc = _replay(nodes, pods, 800)
    with monkeypatch.context() as m:
        _without_shape_costs(m)
        reference, reference_alloc = _replay(nodes, pods, 800)
    assert fast == reference and fast_alloc == reference_alloc
    assert any(not a["NodeNames"] for a in fast)


def _scale_flow(traces: Path | None, nodes: int, fill: float, pods: int) -> list[str]:
    """Each pod's node and GPUs ("" where refused) through the controller's whole placement
    path: watch events, filter with its hold, the bind verb (bench.extender.scale_flow)."""
    stream, _ = scale_flow.tasks(traces, pods, 11)
    flow = scale_flow.build(nodes, 8, fill, stream[::-1], 11)
    decisions: list[str] = []
    asyncio.run(
        scale_flow.run(flow, stream, warm=0, steady=pods - 40, cold=40, decisions=decisions)
    )
    return decisions


@pytest.mark.parametrize(
    ("source", "nodes", "fill"),
    [("synthetic", 60, 0.0), ("synthetic", 30, 0.8), ("openb", 60, 0.0)],
)
def test_bound_gpus_are_the_reference_ones_through_filter_and_bind(
    monkeypatch: pytest.MonkeyPatch, source: str, nodes: int, fill: float
) -> None:
    traces = None
    if source == "openb":
        if not (TRACES / "openb_pod_list_default.csv").is_file():
            pytest.skip(f"openb traces not found at {TRACES} (they are not part of the repository)")
        traces = TRACES
    fast = _scale_flow(traces, nodes, fill, 500)
    with monkeypatch.context() as m:
        _without_shape_costs(m)
        reference = _scale_flow(traces, nodes, fill, 500)
    assert fast == reference
    placed = [d for d in fast if d]
    assert len(placed) > 200 and all(d.split()[1].startswith("GPU-") for d in placed)
    assert fill == 0.0 or len(placed) < len(fast)  # refusals compared too
