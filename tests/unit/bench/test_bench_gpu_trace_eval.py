"""The interference model checked on whole trace runs (bench.gpu.trace_eval)."""

import json
from pathlib import Path

import pytest

from bench.gpu.trace_eval import main, run_stretches, summary
from gpushare.api.errors import InvalidInputError
from gpushare.packing.interference import load_default

DATA = Path(__file__).resolve().parents[3] / "bench" / "gpu" / "data"


def _stretches(name: str) -> list:  # type: ignore[type-arg]
    return run_stretches(json.loads((DATA / name).read_text()), model=load_default(), source=name)


def test_every_shared_batch_job_gets_a_predicted_and_a_measured_stretch() -> None:
    rows = _stretches("run22-h100-results.json")
    light = {s.job: s for s in rows if s.trace == "light" and s.scheme == "gpushare"}
    # Ten batch jobs; the inference service is latency class and is not a target.
    assert len(light) == 10 and not any("infer" in j for j in light)
    # The FP64 GEMM ran alone (a whole GPU, no MPS): predicted 1.0, measured about that.
    gemm = light["light08-dgemm"]
    assert gemm.predicted == 1.0 and gemm.measured == pytest.approx(1.0, abs=0.05)


def test_stacks_of_many_jobs_are_predicted_within_half_a_log_unit_on_average() -> None:
    # MPS without limits runs every job of a trace at once: stacks of five to eleven. With the
    # neighbour terms read pair-wise and up to the whole GPU the model overpredicts them by
    # 1.4x on average (mean log error 0.36 over every stored run); read over every neighbour it
    # was 2.7x (1.00), which held small jobs back beside a few tenants for nothing
    # (docs/packing.md, "The interference model on whole traces").
    rows = [s for f in sorted(DATA.glob("run*-results.json")) for s in _stretches(f.name)]
    result = summary(rows)
    assert result["mps_unlimited"]["jobs"] > 600
    assert 0.0 < result["mps_unlimited"]["mean_log_error"] < 0.5
    # Where gpushare decided, the error is that of the packs the model is fit on.
    assert result["gpushare"]["mape"] < 0.12
    assert result["gpushare"]["false_alarms_at_bound"] <= result["gpushare"]["missed_at_bound"]


def test_the_error_is_broken_down_by_gpu_and_stack_size_for_every_shared_way() -> None:
    # Run 36 ran every batch row opted in too: that way is evaluated like the others, and
    # each job is filed under its GPU and how many neighbours ran beside it on average.
    rows = _stretches("run36-h200-light-mixed-results.json")
    result = summary(rows)
    every = result["gpushare_opportunistic_all"]
    assert every["jobs"] == sum(b["jobs"] for b in every["by_stack"].values()) > 10
    assert all(key.startswith("NVIDIA H200 ") for key in every["by_stack"])
    # MPS without limits starts every job at once: no job of its runs ran alone.
    assert not any(key.endswith(" 0") for key in result["mps_unlimited"]["by_stack"])


def test_a_file_that_is_not_a_results_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="not a GPU benchmark results file"):
        run_stretches({"details": {}}, model=load_default(), source="x.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main([str(bad)]) == 2
