"""bench.sim.throwaway: the attacker of issue 67 in the openb simulator. Its pods are counted
in the controller's pod mix with every arrival; taken back, they leave the mix's counts as the
honest pods alone make them; kept (the controller before the change), they pile up. The CLI
writes a row per list and odd shape with the three ways."""

import json
from pathlib import Path

import pytest

from bench.sim import throwaway
from bench.sim.engine import simulate
from bench.sim.trace import load_nodes, load_pods
from gpushare.packing.interference import load_default
from gpushare.packing.mix import PodMix, shape_of
from tests.unit.bench.test_sim_engine import write_trace


def test_taken_back_the_attackers_pods_leave_only_the_honest_counts() -> None:
    odd = throwaway.SHAPES["whole8"]
    kept, taken = PodMix(), PodMix()
    keep = throwaway.Attacker(odd, rate=2, lifetime=3, take_back=False)
    take = throwaway.Attacker(odd, rate=2, lifetime=3, take_back=True)
    for _ in range(50):
        keep(kept)
        take(taken)
    assert kept.shapes() == {shape_of(odd): 100.0}
    assert taken.shapes() == {shape_of(odd): 6.0}  # the last three arrivals' pods, alive


def test_the_simulator_calls_the_watch_once_per_arrival(tmp_path: Path) -> None:
    trace = write_trace(tmp_path)
    nodes = load_nodes(trace / "openb_node_list_gpu_node.csv")
    pods = load_pods(trace / "openb_pod_list_tiny.csv")
    calls: list[int] = []
    result = simulate(
        nodes, pods, policy="gpushare", seed=3, model=load_default(),
        watch=lambda mix: calls.append(mix.observed),
    )  # fmt: skip
    assert len(calls) == result.pods
    assert calls == sorted(calls)  # the controller's own counts go on between the calls


def test_the_cli_writes_a_row_per_list_and_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(tmp_path)
    out = tmp_path / "throwaway.json"
    argv = ["--traces", str(trace), "--trace", "tiny", "--seeds", "1", "--workers", "1"]
    assert throwaway.main([*argv, "--output", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [(r["trace"], r["shape"]) for r in doc["table"]] == [
        ("tiny", "sliver"),
        ("tiny", "whole8"),
    ]
    for row in doc["table"]:
        assert set(row) >= {"honest", "kept", "taken_back"}
    assert "| tiny | whole8 |" in out.with_suffix(".md").read_text()
    with pytest.raises(SystemExit):
        throwaway.main([*argv, "--trace", "nope"])
    assert "--trace: unknown ['nope']" in capsys.readouterr().err
