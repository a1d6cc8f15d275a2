"""GPU benchmark paths without a GPU: a GPU whose profiler measures nothing (no NVML GPM, before
Hopper) leaves jobs unprofiled, as gpushare's operator does, instead of reading them as idle;
the balanced latency test rotates uncapped training with the reported settings."""

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.gpu import run, traces
from bench.gpu.catalog import KINDS
from bench.gpu.colocate import PackResult, Stage
from bench.gpu.decide import ProductDecider
from bench.gpu.gpm import PROFILE_KEYS
from bench.gpu.runner import warm_launches
from bench.gpu.schemes import Launch
from gpushare.api.profile import GpuProfile
from gpushare.packing.opportunistic import Opportunism
from gpushare.packing.opportunistic_memory import PEAK_HEADROOM, memory_steps

DATA = Path(__file__).resolve().parents[3] / "bench" / "gpu" / "data"


class NoGpmSampler:
    """What ``gpm.Sampler`` answers where GPM is unsupported: no profile for any window."""

    source = "gpushare.node.exporter.profiler (no GPM on this GPU)"

    def __init__(self, **_: Any) -> None:
        pass

    def profile_last(self, window_s: float) -> GpuProfile | None:
        return None

    def close(self) -> None:
        pass


@pytest.fixture
def measured_stages(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Stands in for the workers: every job alone runs at 10 it/s; records the stages run."""
    names: list[str] = []

    def fake(*, pool: Any, stages: list[Stage], deadline: float, on_solo: Any) -> list[Any]:
        out = []
        for stage in stages:
            names.append(stage.name)
            for pack in stage.packs:
                if len(pack) == 1:
                    on_solo(pack[0], 0.0, 2.0, 10.0)
                out.append(PackResult(tuple(pack), tuple(10.0 for _ in pack)))
        return out

    monkeypatch.setattr(run, "measure_stages", fake)
    monkeypatch.setattr(run, "Sampler", NoGpmSampler)
    monkeypatch.setattr(run.Ctx, "daemon", lambda self: None)
    return names


def test_without_gpm_no_job_is_profiled_and_every_unsized_job_asks_for_the_whole_gpu(
    tmp_path: Path, measured_stages: list[str]
) -> None:
    ctx = run.Ctx(
        args=run.parse_args(["--out", str(tmp_path), "--budget-s", "120"]),
        t_start=time.time(),
        tmp=tmp_path,
        gpu_name="NVIDIA A100-SXM4-80GB",
    )
    st = run.State()
    run.phase_a(ctx, st)
    assert st.profiles == {} and st.raw_profiles == {}
    # Only the solo stage ran: packs without profiles could not teach or test the model.
    assert len(measured_stages) == 1
    assert any("no job could be profiled" in e and "GPM" in e for e in ctx.errors)
    assert st.fractions["resnet18"] == 1.0 and st.fractions["infer"] == 0.25
    assert set(st.solo) >= set(KINDS)

    # gpushare then places by requests alone: a row that sets a fraction still shares the GPU.
    decider = run.make_decider(ctx, st)
    assert decider.profiles == {}
    small = traces.TraceJob("a-resnet18", "resnet18", 0.0, 1.0, 0.3, fixed_request=True)
    launch = decider(small, [])
    assert isinstance(launch, Launch) and launch.mps and launch.thread_percent == 100


def test_a_profile_missing_any_counter_the_product_needs_is_not_kept() -> None:
    st = run.State()
    full = dict.fromkeys(PROFILE_KEYS, 0.3) | {"sm_utilization": 0.5}
    run.record_profile(st, "lstm", GpuProfile(**{k: v for k, v in full.items() if k != "tensor"}))
    run.record_profile(st, "dgemm", None)
    assert st.profiles == {}
    run.record_profile(st, "resnet18", GpuProfile(**full))
    assert st.profiles["resnet18"]["tensor"] == 0.3
    assert st.raw_profiles["resnet18"]["sm_utilization"] == 0.5


class WindowPool:
    """A pool whose service answers 9 ms alone, 10 ms beside capped training and 12 ms beside
    uncapped training; training runs 20 it/s capped, 28 uncapped."""

    def __init__(self) -> None:
        self.windows: list[tuple[str, ...]] = []

    def ensure(self, members: Any, **_: Any) -> dict[Any, str]:
        return {}

    def window(self, members: list[Any], **_: Any) -> list[dict[str, Any]]:
        self.windows.append(tuple(f"{m.kind}@{m.thread_percent}" for m in members))
        if len(members) == 1:
            return [{"latencies_ms": [9.0] * 50}]
        uncapped = members[1].thread_percent == 100
        return [
            {"latencies_ms": [12.0 if uncapped else 10.0] * 50},
            {"rate": 28 if uncapped else 20},
        ]


def test_the_balanced_latency_test_reports_uncapped_training_as_a_rotated_setting() -> None:
    from bench.gpu import latency  # noqa: PLC0415

    ctx = run.Ctx(args=run.parse_args(["--out", "x"]), t_start=0.0, tmp=Path("x"))
    st = run.State()
    for kind in ("infer", "resnet50"):
        run.record_profile(
            st, kind, GpuProfile(**dict.fromkeys(PROFILE_KEYS, 0.3), sm_utilization=0.8)
        )
    pool = WindowPool()
    out = latency.measure(
        pool=pool,  # type: ignore[arg-type]
        decider=run.make_decider(ctx, st),
        train_solo=28.0,
        window_s=1.0,
        rounds=4,
        calibration_rounds=2,
        rotate_uncapped=True,
    )
    rows = {r["setting"]: r for r in out["rows"]}
    assert rows[latency.UNCAPPED]["windows"] == 4 and rows[latency.SHARED]["windows"] == 4
    assert rows[latency.UNCAPPED]["p99_ms"] == 12.0 and out["shared_p99_ms"] == 10.0
    assert rows[latency.UNCAPPED]["train_share"] == 1.0 and out["train_retained_ratio"] == 0.714
    # No context windows: the uncapped setting takes each place in the order once.
    assert not any(str(o[0]).startswith("context") for o in out["order"])
    assert sorted(o.index(latency.UNCAPPED) for o in out["order"]) == [0, 1, 2, 3]


def test_a_budget_too_short_for_the_traces_is_named_before_any_gpu_work(tmp_path: Path) -> None:
    # Without --budget-s a run gets what its comparisons need.
    assert run.budget_warning(run.parse_args(["--out", str(tmp_path)])) is None
    long = tmp_path / "long.json"
    long.write_text('[{"arrival_s": 0, "kind": "resnet50", "work_s": 300}]')
    argv = ["--out", str(tmp_path), "--trace", str(long)]
    args = run.parse_args([*argv, "--budget-s", "700"])
    warning = run.budget_warning(args)
    assert warning is not None
    # Exclusive FIFO alone takes 330 s of 300 s of work; MPS without limits and gpushare with
    # the defaults and with every batch row opted in 240 s each (no row is marked).
    assert run.budget_needed(args) > 330 + 3 * 240 + 0.28 * 700
    assert "--budget-s 700 is short" in warning and "--traces" in warning
    suggested = int(warning.split("Give --budget-s ")[1].split()[0])
    assert run.budget_warning(run.parse_args([*argv, "--budget-s", str(suggested)])) is None


def test_the_plan_lists_every_run_and_says_whether_the_budget_holds_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The batch commands of docs/benchmarks-gpu.md: each half of the shipped traces, resumed.
    common = ["--out", str(tmp_path), "--resume", "auto", "--latency-rounds", "0",
              "--budget-s", "540", "--plan"]  # fmt: skip
    assert run.main([*common, "--traces", "light,heavy,mixed"]) == 0
    first = capsys.readouterr().out
    assert run.main([*common, "--traces", "bursty,long-short,notebooks"]) == 0
    second = capsys.readouterr().out
    for text in (first, second):
        assert "of a 540-s budget: fits" in text
        assert "gpushare_opportunistic_all" in text and "mps_unlimited" in text
    assert "comparisons: 504 s" in first and "comparisons: 515 s" in second
    # The notebook kind is in no stored phase A: it is measured alone first.
    assert "phase A: 0 s" in first and "phase A: 17 s" in second
    assert not (tmp_path / "run.log").exists()  # --plan touches nothing
    assert run.main([*common[:-1], "--plan"]) == 0
    every = capsys.readouterr().out
    assert "comparisons: 1020 s" in every and "does NOT fit" in every  # all six in one call: no


def test_shipped_traces_are_chosen_by_name_and_an_unknown_name_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = run.parse_args(["--out", str(tmp_path), "--traces", "notebooks,bursty"])
    assert [t.name for t in args.traces] == ["notebooks", "bursty"]
    with pytest.raises(SystemExit):
        run.parse_args(["--out", str(tmp_path), "--traces", "lihgt"])
    assert "'lihgt' is not a shipped trace" in capsys.readouterr().err


def test_a_trace_with_more_jobs_than_one_mps_server_serves_is_refused_before_gpu_work(
    tmp_path: Path,
) -> None:
    rows = [{"arrival_s": i * 0.1, "kind": "resnet18", "work_s": 1} for i in range(25)]
    path = tmp_path / "many.json"
    path.write_text(json.dumps(rows))
    with pytest.raises(traces.TraceError, match="25 rows, more than 24; split it"):
        traces.load_trace(path)
    path.write_text(json.dumps(rows[:24]))
    assert len(traces.load_trace(path).jobs) == 24


def test_a_trace_without_a_latency_pod_warms_one_process_a_job_not_two(tmp_path: Path) -> None:
    ctx = run.Ctx(args=run.parse_args(["--out", str(tmp_path)]), t_start=0.0, tmp=tmp_path)
    st = run.State()
    run.record_profile(
        st, "resnet18", GpuProfile(**dict.fromkeys(PROFILE_KEYS, 0.1), sm_utilization=0.3)
    )
    decider = run.make_decider(ctx, st)
    job = traces.TraceJob("a-resnet18", "resnet18", 0.0, 1.0, 0.1)
    # Beside a latency pod the product caps it at half the GPU; alone it runs uncapped.
    assert [v.thread_percent for v in decider.variants(job)] == [100, 50]
    assert [v.thread_percent for v in decider.variants(job, beside_latency=False)] == [100]


def _worker_events(lines: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.gpu.worker", "--device", "sleep"],
        input=lines,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
    )
    return [json.loads(x[3:]) for x in done.stdout.splitlines() if x.startswith("@@ ")]


def test_a_worker_reports_its_work_times_latencies_and_peak_memory_field() -> None:
    warm = _worker_events('{"cmd":"init","kind":"resnet18"}\n{"cmd":"run","iterations":3}\n')
    done = warm[-1]
    assert done["event"] == "done" and done["t_ready"] == done["t_go"] <= done["t_end"]
    assert done["latencies_ms"] == [] and "peak_mib" in done  # no CUDA here: null
    assert "process_mib" in done and done["process_mib"] is None  # NVML's figure: none here
    cold = _worker_events('{"cmd":"job","kind":"infer","iterations":4}\n')[-1]
    assert cold["event"] == "done" and cold["t_go"] <= cold["t_ready"] <= cold["t_end"]
    assert len(cold["latencies_ms"]) == 4  # a service answers requests, one latency each


def test_run_19_recorded_every_finished_jobs_peak_memory_the_same_on_both_gpus() -> None:
    data = Path(__file__).resolve().parents[3] / "bench" / "gpu" / "data"
    peaks: dict[str, dict[str, int]] = {}
    for gpu in ("h100", "h200"):
        jobs = json.loads((data / f"run19-{gpu}-results.json").read_text())["details"]["jobs"]
        for schemes in jobs.values():
            for rows in schemes.values():
                for row in rows:
                    if row.get("error") is None and row.get("end_s") is not None:
                        assert isinstance(row["peak_mib"], int) and row["peak_mib"] > 0
                        seen = peaks.setdefault(gpu, {})
                        seen[row["kind"]] = max(seen.get(row["kind"], 0), row["peak_mib"])
    # docs/benchmarks-gpu.md, "Memory each job used"
    assert peaks["h100"] == peaks["h200"]
    assert peaks["h100"]["resnet50_xl"] == 12002 and peaks["h100"]["infer"] == 204


def test_opportunistic_placement_may_give_a_job_the_peak_it_showed_alone() -> None:
    # A GpuShare's profile carries the peak memory its job used alone; the benchmark's stand-in
    # is the larger of the kind's process after its solo window in phase A (NVML's figure,
    # else the allocator's peak plus the context allowance) and the catalogue's declared
    # figure, and only the opportunistic memory steps read it.
    assert run.memory_of({"process_mib": 5000, "peak_mib": 4000}) == 5000
    assert run.memory_of({"process_mib": None, "peak_mib": 580}) == 580 + run.CONTEXT_ALLOWANCE_MIB
    assert run.memory_of({"process_mib": None, "peak_mib": None}) is None  # a dry run
    st = run.State(memory={"transformer": 6000, "lstm": 900})
    peaks = run.alone_peaks(st)
    assert peaks["transformer"] == 6000 << 20  # measured, above the declared 5148
    assert peaks["lstm"] == KINDS["lstm"].memory_mib << 20  # declared 1338, above 900
    assert peaks["vit"] == KINDS["vit"].memory_mib << 20  # not measured in this run
    decider = ProductDecider(profiles={}, gpu_model="H100", gpu_memory_bytes=80 << 30, peaks=peaks)
    job = traces.TraceJob("t", "transformer", 0.0, 1.0, 0.65)
    demand = decider.demand(job)
    assert demand.peak_memory_bytes == 6000 << 20
    steps = memory_steps(demand, 80 << 30)
    assert steps[-1] == math.ceil((6000 << 20) * PEAK_HEADROOM)


def test_the_expected_seconds_add_up_to_about_what_run_25_took(tmp_path: Path) -> None:
    # docs/benchmarks-gpu.md, "The batch run": run 25's H100 call, resumed, latency stage on.
    stored = json.loads((DATA / "run25-h100-results.json").read_text())
    args = run.parse_args(["--out", str(tmp_path), "--resume", "auto"])
    by_name = {t.name: t for t in args.traces}
    expected = sum(
        run.scheme_need_s(scheme, by_name[trace].work_s)
        for trace, schemes in stored["traces"].items()
        for scheme in schemes
    )
    expected += run.latency_plan(args)[2]
    assert expected == pytest.approx(581, abs=1)
    assert stored["details"]["run_s"] == pytest.approx(569, abs=1)


def test_on_run_16s_h100_profiles_every_job_is_warm(tmp_path: Path) -> None:
    # docs/benchmarks-gpu.md, "A fair harness": the warm-up plan from the stored H100 phase A
    # and the declared memory, on the traces whose kinds it profiled.
    names = ["light", "heavy", "mixed", "bursty", "long-short"]
    args = run.parse_args(["--out", str(tmp_path), "--traces", ",".join(names),
                           "--resume", str(DATA / "run16-h100-phase-a.json")])  # fmt: skip
    ctx = run.Ctx(args=args, t_start=0.0, tmp=tmp_path, gpu_name="NVIDIA H100 80GB HBM3",
                  memory_bytes=81559 << 20)  # fmt: skip
    st = run.State()
    run.load_state(st, args.resume)
    run.size_and_choose(ctx, st)
    run.prepare_jobs(ctx, st)
    opportunism = Opportunism()
    opt_in = run.make_decider(ctx, st, opportunism=opportunism)
    learning = run.make_decider(ctx, st, opportunism=opportunism, honour_opt_in=False)
    warmed: dict[str, int] = {}
    for name in names:
        ways = run.trace_ways(ctx, st, name, learning=learning, opt_in=opt_in)
        plan = run.plan_warm_up(ctx, st, name, ways)
        assert plan.cold == (), (name, plan.why_cold)
        assert max(plan.worst_mib.values()) <= 48_700  # of 69,325 usable
        every = ways[run.OPPORTUNISTIC_ALL]
        scheme = every.make()
        warmed[name] = sum(
            len(warm_launches(scheme.prepare(j), memory_mib=plan.memory_mib[j.id]))
            for j in every.jobs
        )
    # light holds the latency pod: its opted-in jobs also warm the cap they get beside it
    # (run 31 started three of them cold without it).
    assert warmed == {"light": 22, "heavy": 6, "mixed": 10, "bursty": 13, "long-short": 12}


def test_each_way_names_the_run_that_answers_it() -> None:
    def job(i: int, kind: str, marked: bool) -> traces.TraceJob:
        return traces.TraceJob(f"j{i}", kind, float(i), 1.0, 0.2, opportunistic=marked)

    some = [job(0, "resnet18", True), job(1, "lstm", False), job(2, "infer", False)]
    assert run.way_names("t", some) == {
        "defaults": "gpushare",
        "marked": "gpushare_opportunistic",
        "every batch row": "gpushare_opportunistic_all",
    }
    # Every batch row already marked: the third way is the marked run, not run twice.
    every = [job(0, "resnet18", True), job(1, "lstm", True), job(2, "infer", False)]
    assert run.way_names("t", every)["every batch row"] == "gpushare_opportunistic"
    assert run.OPPORTUNISTIC_ALL not in run.planned_schemes("t", every)
    # Nothing marked: no marked run.
    none = [job(0, "resnet18", False)]
    assert "marked" not in run.way_names("t", none)
    assert run.OPPORTUNISTIC not in run.planned_schemes("t", none)


def test_resume_auto_takes_the_newest_phase_a_stored_for_the_gpu_model() -> None:
    assert run.stored_phase_a("NVIDIA H100 80GB HBM3") == DATA / "run16-h100-phase-a.json"
    assert run.stored_phase_a("NVIDIA H200") == DATA / "run16-h200-phase-a.json"
    # None stored for this model: the run measures each kind alone instead.
    assert run.stored_phase_a("NVIDIA A100-SXM4-80GB") is None


def test_a_stored_phase_a_is_recorded_by_its_path_in_the_repository(tmp_path: Path) -> None:
    # Results are committed: they name the stored file, not the directory a machine holds it in.
    stored = run.stored_phase_a("NVIDIA H200")
    assert stored is not None and stored.is_absolute()
    assert run.recorded_path(stored) == f"bench/gpu/data/{stored.name}"
    elsewhere = tmp_path / "phase-a.json"
    assert run.recorded_path(elsewhere) == str(elsewhere)  # a user's own file, as given
