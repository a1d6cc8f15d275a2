"""Drawn job mixes: the same seed gives the same valid trace, with user-set requests and limits
among the rows, and a bad request is refused naming the option."""

import json
from pathlib import Path

import pytest

from bench.gpu import mixes, traces
from bench.gpu.catalog import KINDS


def test_the_same_seed_draws_the_same_mix_and_another_seed_a_different_one() -> None:
    assert mixes.draw(3) == mixes.draw(3)
    assert mixes.draw(3) != mixes.draw(4)


def test_a_drawn_mix_is_a_trace_the_benchmark_runs_with_arrivals_in_order(tmp_path: Path) -> None:
    path = tmp_path / "mix-5.json"
    assert mixes.main(["--seed", "5", "--jobs", "12", "--out", str(path)]) == 0
    trace = traces.load_trace(path)
    assert trace.name == "mix-5" and len(trace.jobs) == 12
    arrivals = [j.arrival_s for j in trace.jobs]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    assert {j.kind for j in trace.jobs} <= set(KINDS)
    assert sum(j.kind == "infer" for j in trace.jobs) <= 1


def test_over_many_seeds_some_users_set_requests_and_limits_and_limits_never_undercut() -> None:
    rows = [r for seed in range(40) for r in mixes.draw(seed)]
    with_fraction = [r for r in rows if "fraction" in r]
    with_limit = [r for r in rows if "limit" in r]
    assert 0.25 * len(rows) < len(with_fraction) < 0.5 * len(rows)
    assert with_limit and all(float(r["limit"]) >= float(r["fraction"]) for r in with_limit)
    assert not any("fraction" in r for r in rows if r["kind"] == "infer")
    # Every kind of the catalogue turns up: the draw is not tuned to the shipped traces' kinds.
    assert {r["kind"] for r in rows} == set(KINDS)
    text = mixes.render(rows[:30])
    assert json.loads(text) == rows[:30]


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--seed", "1", "--jobs", "0"], "--jobs"),
        (["--seed", "1", "--jobs", "999"], "--jobs"),
        (["--seed", "1", "--mean-gap-s", "0"], "--mean-gap-s"),
    ],
)
def test_a_bad_request_is_refused_naming_the_option(
    argv: list[str], field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.json"
    with pytest.raises(SystemExit):
        mixes.main([*argv, "--out", str(out)])
    assert field in capsys.readouterr().err and not out.exists()


def test_a_mix_written_anywhere_but_a_json_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        mixes.main(["--seed", "1", "--out", str(tmp_path / "m.csv")])
    assert "--out" in capsys.readouterr().err
