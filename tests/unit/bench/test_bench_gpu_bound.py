"""The makespan bound from measured packs (no GPU)."""

import json

import pytest

from bench.gpu import bound, colocate
from tests import REPO

DATA = REPO / "bench" / "gpu" / "data"
RUNS = {
    "run7": (DATA / "run7-results.json", DATA / "run7-colocations.json"),
}


def rate(name: str, slowest: float = 1.0, **work: float) -> bound.PackRate:
    return bound.PackRate(name, work, dict.fromkeys(work, 1), slowest)


def test_a_pack_that_keeps_both_jobs_fast_beats_running_them_one_after_the_other() -> None:
    alone = [rate("a", a=1.0), rate("b", b=1.0)]
    good, used = bound.fluid_bound({"a": 2.0, "b": 2.0}, [*alone, rate("ab", 0.8, a=0.8, b=0.8)])
    assert good == pytest.approx(2.5)
    assert used == [("ab", pytest.approx(2.5))]
    poor, _ = bound.fluid_bound({"a": 2.0, "b": 2.0}, [*alone, rate("ab", 0.4, a=0.4, b=0.4)])
    assert poor == pytest.approx(4.0)


def test_work_no_pack_can_run_is_refused_naming_the_kind() -> None:
    with pytest.raises(ValueError, match=r"work: no pack runs kinds \['b'\]"):
        bound.fluid_bound({"a": 1.0, "b": 1.0}, [rate("a", a=1.0)])


@pytest.mark.parametrize("run", sorted(RUNS))
def test_half_exclusive_is_below_what_measured_packs_allow_within_2x(run: str) -> None:
    # Issue 8's light-trace targets together: makespan <= 0.50x exclusive with no job past 2x.
    # With only packs in which every job keeps half its solo speed, even a preemptive schedule
    # without arrivals or gaps needs more than half the exclusive makespan on both runs.
    results_path, packs_path = RUNS[run]
    results = json.loads(results_path.read_text())
    records = colocate.validate(json.loads(packs_path.read_text()))
    out = bound.bounds(results=results, records=records, trace="light")
    within = out["every_job_within_2x"]
    assert 0.50 < within["vs_exclusive"] < 0.52
    assert out["any_pack"]["makespan_s"] < within["makespan_s"]
    assert out["last_arrival_plus_its_run_s"] < 5.0
    # one ResNet-50 job in the trace: no pack of two ResNet-50 may be used
    assert not any(name.count("resnet50@") > 1 for name in within["packs"])
