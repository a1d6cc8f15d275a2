"""Drawn job mixes: the same seed gives the same valid trace, with user-set requests and limits
among the rows, and a bad request is refused naming the option."""

import json
from pathlib import Path

import pytest

from bench.gpu import mixes, report, traces
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


def test_a_third_of_the_batch_rows_opt_in_and_the_marks_change_no_other_field() -> None:
    for seed in range(30):
        rows = mixes.draw(seed, jobs=12)
        batch = [r for r in rows if r["kind"] != "infer"]
        marked = [r for r in rows if r.get("opportunistic")]
        # A third of the batch rows, rounded; a latency row is never opted in (admission
        # would refuse it), so each mix runs three different ways.
        assert len(marked) == max(1, round(len(batch) / 3))
        assert all(r["kind"] != "infer" for r in marked)
        unmarked = mixes.draw(seed, jobs=12, marked_share=0)
        assert not any("opportunistic" in r for r in unmarked)
        assert [{k: v for k, v in r.items() if k != "opportunistic"} for r in rows] == unmarked
    assert all(
        r.get("opportunistic")
        for r in mixes.draw(1, jobs=12, marked_share=1)
        if r["kind"] != "infer"
    )


def test_the_shipped_marked_mixes_are_what_their_seeds_draw() -> None:
    """Mixes 7 and 8 (run 46) and 9 and 10 (run 48) come back from their seeds at this
    catalogue. A kind added to the catalogue changes every draw, as it did for mixes 1-6: then
    record them as drawn from the older catalogue and drop them here."""
    for seed, gap in ((7, 0.3), (8, 0.3), (9, 0.3), (10, 0.5)):
        path = Path(traces.__file__).parent / "data" / "mixes" / f"mix-{seed}.json"
        assert json.loads(path.read_text()) == mixes.draw(seed, jobs=12, mean_gap_s=gap)


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--seed", "1", "--jobs", "0"], "--jobs"),
        (["--seed", "1", "--jobs", "999"], "--jobs"),
        (["--seed", "1", "--mean-gap-s", "0"], "--mean-gap-s"),
        (["--seed", "1", "--marked-share", "1.5"], "--marked-share"),
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


def _job(jid: str, arrival: float, start: float, end: float) -> dict[str, object]:
    return {"id": jid, "arrival_s": arrival, "start_s": start, "end_s": end, "error": None}


def _mix_run(gpu: str) -> dict[str, object]:
    """A two-job mix: a big job and a small one arriving just after it. Exclusive FIFO runs
    them back to back; MPS without limits overlaps them (shortest makespan, the small job
    slowed 3x); gpushare makes the big job wait for the small one (a starved large request)."""
    jobs = {
        "exclusive": [_job("big", 0.0, 0.0, 4.0), _job("small", 0.5, 4.0, 5.0)],
        "mps_unlimited": [_job("big", 0.0, 0.0, 4.5), _job("small", 0.5, 0.5, 3.5)],
        "gpushare": [_job("small", 0.5, 0.5, 1.5), _job("big", 0.0, 1.5, 5.5)],
    }
    traces_out = {
        "mix-9": {
            s: {"makespan_s": max(j["end_s"] for j in js), "mean_jct_s": 0.0, "throughput": 1.0}
            for s, js in jobs.items()
        }
    }
    for s, js in jobs.items():
        jct = [float(j["end_s"]) - float(j["arrival_s"]) for j in js]  # type: ignore[arg-type]
        traces_out["mix-9"][s]["mean_jct_s"] = sum(jct) / len(jct)
    return {"gpu": gpu, "traces": traces_out, "details": {"jobs": {"mix-9": jobs}}}


def test_any_trace_compares_gpushare_with_exclusive_and_the_best_other_scheme() -> None:
    (c,) = report.comparisons(_mix_run("NVIDIA H100 80GB HBM3"))
    assert c["trace"] == "mix-9"
    # Makespan: MPS without limits is best (4.5 s); gpushare 5.5 s is 1.22x it, 1.1x exclusive.
    assert c["makespan_s_best_other"] == "mps_unlimited"
    assert c["makespan_s_vs_best_other"] == pytest.approx(5.5 / 4.5, abs=1e-3)
    assert c["makespan_s_vs_exclusive"] == pytest.approx(1.1, abs=1e-3)
    # Stretch: under gpushare the big job waited 1.5 s, 5.5 s for 4 s of work; the small job
    # ran at once (1.0). Exclusive FIFO's worst is the small job (4.5 s for 1 s of work).
    assert c["gpushare"]["max_stretch"] == pytest.approx(1.375)
    assert c["max_stretch_best_other"] == "mps_unlimited"  # big 1.125, small 3.0
    assert c["max_stretch_vs_exclusive"] == pytest.approx(1.375 / 4.5, abs=1e-3)
    assert c["mean_stretch_vs_exclusive"] < 1 < c["makespan_s_vs_best_other"]
    assert c["failed"] == {"exclusive": 0, "gpushare": 0, "mps_unlimited": 0}


def test_a_scheme_whose_jobs_failed_says_so_beside_its_ratios() -> None:
    run = _mix_run("NVIDIA H100 80GB HBM3")
    run["details"]["schemes"] = {"mix-9": {"gpushare": {"failed": ["small"]}}}  # type: ignore[index]
    (c,) = report.comparisons(run)
    assert c["failed"]["gpushare"] == 1
    assert report.comparison_table([c])[0].endswith("| gpushare 1 |")


def test_a_latency_service_in_the_trace_is_compared_by_its_request_p99() -> None:
    run = _mix_run("NVIDIA H200")
    assert report.comparisons(run)[0]["gpushare"]["inference_p99_ms"] is None
    p99 = {"exclusive": 19.0, "mps_unlimited": 2800.0, "gpushare": 24.7}
    run["details"]["schemes"] = {  # type: ignore[index]
        "mix-9": {s: {"inference_p99_ms": v} for s, v in p99.items()}
    }
    (c,) = report.comparisons(run)
    assert c["inference_p99_ms_best_other"] == "exclusive"
    assert c["inference_p99_ms_vs_best_other"] == pytest.approx(1.3, abs=1e-3)
    assert "| 24.7 ms: 1.30 / 1.30 (exclusive) |" in report.comparison_table([c])[0]


def test_a_trace_without_exclusive_fifo_or_gpushare_gets_no_comparison() -> None:
    run = _mix_run("NVIDIA H200")
    del run["details"]["jobs"]["mix-9"]["exclusive"]  # type: ignore[index]
    assert report.comparisons(run) == []


def test_a_merged_record_of_mixes_takes_its_own_name_and_lists_each_gpus_comparisons(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_mix_run("NVIDIA H100 80GB HBM3")))
    b.write_text(json.dumps(_mix_run("NVIDIA H200")))
    out = tmp_path / "out"
    assert report.main(["merge", str(a), str(b), "--out", str(out), "--name", "gpu-mixes"]) == 0
    record = json.loads((out / "gpu-mixes.json").read_text())
    assert [(c["gpu"], c["trace"]) for c in record["comparisons"]] == [
        ("H100", "mix-9"),
        ("H200", "mix-9"),
    ]
    md = (out / "gpu-mixes.md").read_text()
    assert "| H200: mix-9 | 1.10 / 1.22 (mps_unlimited) |" in md
    assert not (out / "gpu-packing.json").exists()
    with pytest.raises(SystemExit):
        report.main(["merge", str(a), "--out", str(out), "--name", "../x"])
    assert "--name" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("gpu", "label"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("Tesla T4", "T4"),
    ],
)
def test_a_merged_record_labels_each_gpu_by_its_model(gpu: str, label: str) -> None:
    assert report.short_name(gpu) == label
