"""The extender latency benchmark (bench/extender/bench_extender.py) runs end to end against the
real extender server: its cold phase empties the extender's answer caches before every pod, so
a rename of those caches breaks this test, not a benchmark run on a lent machine."""

import argparse
import asyncio
from pathlib import Path

from bench.extender.bench_extender import main_async


def test_steady_and_cold_phases_time_every_pod_and_pass_nodes(tmp_path: Path) -> None:
    args = argparse.Namespace(
        nodes=20, gpus_per_node=4, pods=8, cold_pods=4, policy="binpack", seed=3,
        gc_freeze=False, out=tmp_path,
    )  # fmt: skip
    result = asyncio.run(main_async(args))
    assert result["pods"] == 8 and result["cold"]["pods"] == 4
    assert result["passed_nodes_mean"] > 0 and result["cold"]["passed_nodes_mean"] > 0
    assert 0 < result["filter_p50_ms"] <= result["filter_p99_ms"]


def test_scale_flow_places_each_pod_through_filter_and_bind(tmp_path: Path) -> None:
    args = argparse.Namespace(
        flow="scale", nodes=12, gpus_per_node=4, pods=10, cold_pods=4, warm_pods=3,
        fill=0.6, policy="gpushare", seed=3, gc_freeze=False, nodes_percent=None, counts_share=True,
        traces=tmp_path / "absent", profile=None, out=tmp_path,
    )  # fmt: skip
    result = asyncio.run(main_async(args))
    assert result["pods_from"] == "synthetic"
    assert result["steady"]["pods"] == 10 and result["cold"]["pods"] == 4
    for phase in ("steady", "cold"):
        assert result[phase]["placed"] > 0 and result[phase]["bind"]["p50_ms"] > 0
