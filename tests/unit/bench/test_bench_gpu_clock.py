"""The GPU benchmark's trace clock and its starts, without a GPU (issue 65, "A fair harness"):
a slow start never delays another job, and every job starts warm or cold the same way under
every scheme."""

import json
import queue
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from bench.gpu import report, run, warmup
from bench.gpu.metrics import JobResult, summarize
from bench.gpu.procs import Event, Workers
from bench.gpu.runner import Attempt, drive, run_trace, warm_launches
from bench.gpu.schemes import ExclusiveFifo, Launch, TimeSlice
from bench.gpu.traces import TraceJob
from bench.gpu.warmup import SchemeNeed, WarmPlan

REPO = Path(__file__).resolve().parents[3]


class FakeStarter:
    """Starts each job after ``start_s[kind]`` seconds of start-up and finishes it
    ``work_s[kind]`` seconds later, reporting as a worker process would; ``start`` itself
    returns at once, as the real starter's does."""

    def __init__(self, start_s: Mapping[str, float], work_s: Mapping[str, float]) -> None:
        self.start_s = start_s
        self.work_s = work_s
        self._events: queue.Queue[Event] = queue.Queue()
        self.stopped: list[str] = []
        self.calls: list[tuple[str, float]] = []
        self.timers: list[threading.Timer] = []

    @property
    def events(self) -> "queue.Queue[Event]":
        return self._events

    def start(self, launch: Launch, *, iterations: int, seed: int) -> Attempt:
        job = launch.job
        label = f"{job.id}.{len(self.calls)}"
        self.calls.append((job.id, time.time()))
        begin = self.start_s.get(job.kind, 0.0)
        end = begin + self.work_s.get(job.kind, 0.1)

        def started() -> None:
            self._events.put(Event(label, "started", {"t_ready": time.time()}))

        def done() -> None:
            if label not in self.stopped:
                self._events.put(Event(label, "done", {"t_end": time.time()}))

        for delay, fn in ((begin, started), (end, done)):
            timer = threading.Timer(delay, fn)
            timer.daemon = True
            timer.start()
            self.timers.append(timer)
        return Attempt(label, cold=begin > 0)

    def stop(self, label: str) -> None:
        self.stopped.append(label)

    def tail(self, label: str) -> str:
        return ""


def _job(job_id: str, kind: str, arrival: float) -> TraceJob:
    return TraceJob(job_id, kind, arrival, 1.0, 0.5)


def _results(jobs: list[TraceJob]) -> dict[str, JobResult]:
    return {j.id: JobResult(j.id, j.kind, j.gpu_class, j.arrival_s, 10) for j in jobs}


def test_a_slow_start_never_delays_another_jobs_arrival_or_launch() -> None:
    # A takes 2 s to start; B and C arrive while it starts. With every start made on the
    # clock's thread, B and C would wait those 2 s.
    jobs = [_job("a", "transformer", 0.0), _job("b", "resnet18", 0.3), _job("c", "lstm", 0.6)]
    results = _results(jobs)
    starter = FakeStarter({"transformer": 2.0}, {"transformer": 0.2, "resnet18": 0.2, "lstm": 0.2})
    drive(scheme=TimeSlice(), jobs=jobs, results=results, starter=starter, timeout_s=30)
    a, b, c = (results[j] for j in "abc")
    assert all(r.ok for r in (a, b, c))
    assert b.launched_s is not None and b.launched_s < 0.3 + 0.3
    assert c.launched_s is not None and c.launched_s < 0.6 + 0.3
    assert b.end_s is not None and a.start_s is not None and b.end_s < a.start_s
    # A's JCT carries its start-up inside the clock; its run time does not.
    assert a.start_s - (a.launched_s or 0) == pytest.approx(2.0, abs=0.3)
    assert a.run_s == pytest.approx(0.2, abs=0.2) and a.jct_s > 2.0
    assert a.cold_starts == 1 and a.startup_in_clock_s == pytest.approx(2.0, abs=0.3)
    assert b.cold_starts == 0 and b.startup_in_clock_s == 0.0
    summary = summarize(list(results.values()), solo_run_s={})
    assert summary["cold_starts"] == 1 and summary["discarded_gpu_s"] == 0.0


def test_a_job_holds_its_place_while_it_starts() -> None:
    # One job at a time: the second waits for the first, its start-up included.
    jobs = [_job("a", "transformer", 0.0), _job("b", "resnet18", 0.1)]
    results = _results(jobs)
    starter = FakeStarter({"transformer": 0.8}, {"transformer": 0.2, "resnet18": 0.2})
    drive(scheme=ExclusiveFifo(), jobs=jobs, results=results, starter=starter, timeout_s=30)
    a, b = results["a"], results["b"]
    assert a.end_s is not None and b.launched_s is not None and b.launched_s >= a.end_s


class Preempting(TimeSlice):
    """Starts every job on arrival; the job ``victim`` is preempted by the one after it."""

    def __init__(self, victim: str, by: str) -> None:
        self.victim, self.by = victim, by

    def select(self, pending: Any, running: Any) -> list[Launch]:
        return [
            Launch(j, evict=(self.victim,) if j.id == self.by and any(
                r.job.id == self.victim for r in running) else ())
            for j in pending
        ]  # fmt: skip


def test_a_killed_job_counts_the_work_it_had_done_as_discarded() -> None:
    jobs = [_job("a", "transformer", 0.0), _job("b", "resnet18", 0.5)]
    results = _results(jobs)
    starter = FakeStarter({}, {"transformer": 0.6, "resnet18": 0.2})
    drive(scheme=Preempting("a", "b"), jobs=jobs, results=results, starter=starter,
          timeout_s=30)  # fmt: skip
    a = results["a"]
    assert a.ok and len(a.preemptions) == 1
    # It had worked about 0.5 s when b's launch killed it; that work was thrown away.
    assert a.discarded_s == pytest.approx(0.5, abs=0.2)
    assert starter.stopped == ["a.0"]
    assert summarize(list(results.values()), solo_run_s={})["discarded_gpu_s"] == pytest.approx(
        0.5, abs=0.2
    )


def _workers(tmp_path: Path) -> Workers:
    """Dry-run workers (no torch: each step sleeps), started from this checkout."""
    return Workers(device="sleep", tiny=False, log_dir=tmp_path,
                   base_env={"PYTHONPATH": str(REPO)})  # fmt: skip


def test_real_worker_processes_start_warm_and_cold_without_a_gpu(tmp_path: Path) -> None:
    # The process starter with the dry-run stand-in: "a" warmed up before the clock, "b" cold
    # (imported before the clock, its start-up inside it).
    jobs = [_job("a", "resnet18", 0.0), _job("b", "lstm", 0.1)]
    out = run_trace(
        scheme=TimeSlice(),
        jobs=jobs,
        iterations={"a": 5, "b": 5},
        workers=_workers(tmp_path),
        pipe_dir=None,
        timeout_s=60,
        warm_ids={"a"},
    )
    a, b = out
    assert a.ok and b.ok, (a.error, b.error)
    assert (a.cold_starts, b.cold_starts) == (0, 1)
    assert a.init_s is not None and b.init_s is None
    assert b.launched_s is not None and b.start_s is not None and b.start_s >= b.launched_s
    assert json.dumps(b.to_json())  # the results record it


# --- warm or cold, decided once per trace --------------------------------------------------


def _need(name: str, limits: dict[str, list[int | None]], *, mps: bool = True) -> SchemeNeed:
    return SchemeNeed(name, mps, limits)


def _plan(jobs: list[TraceJob], needs: list[SchemeNeed], memory: dict[str, int],
          gpu_mib: int = 10_000, idle: dict[str, int] | None = None) -> WarmPlan:  # fmt: skip
    return warmup.plan(jobs, needs=needs, memory_mib=memory, memory_source={},
                       gpu_memory_mib=gpu_mib, idle_mib=idle)  # fmt: skip


def test_jobs_are_warm_in_arrival_order_while_every_schemes_warm_ups_fit_the_gpu() -> None:
    jobs = [_job("a", "resnet50", 0.0), _job("b", "resnet50", 1.0), _job("c", "lstm", 2.0)]
    memory = {"a": 2000, "b": 2000, "c": 500}
    once = {j.id: [None] for j in jobs}
    # gpushare warms a and b three times each (three settings), c once.
    gpushare = _need("gpushare", {"a": [None, None, None], "b": [None, None, None], "c": [None]})
    plan = _plan(jobs, [_need("exclusive", once, mps=False), gpushare], memory)
    # Usable: 8500 MiB. a warm: 6000 + b, c cold 2500 = 8500; b warm too would be 12500.
    assert plan.usable_mib == 8500
    assert plan.warm == ("a", "c") and plan.cold == ("b",)
    assert "gpushare would hold" in plan.why_cold["b"]
    assert plan.worst_mib == {"exclusive": 4500, "gpushare": 8500}
    # The same decision holds for every scheme: exclusive FIFO alone would have warmed all.
    assert _plan(jobs, [_need("exclusive", once, mps=False)], memory).cold == ()


def test_a_jobs_waiting_processes_count_what_they_hold_once_warmed_up() -> None:
    # The same trace as above, each kind measured to hold 300 MiB waiting (its warm-up's
    # activations given back): of a's three gpushare processes one runs (2000), two wait.
    jobs = [_job("a", "resnet50", 0.0), _job("b", "resnet50", 1.0), _job("c", "lstm", 2.0)]
    memory = {"a": 2000, "b": 2000, "c": 500}
    once = {j.id: [None] for j in jobs}
    gpushare = _need("gpushare", {"a": [None, None, None], "b": [None, None, None], "c": [None]})
    needs = [_need("exclusive", once, mps=False), gpushare]
    plan = _plan(jobs, needs, memory, idle={"a": 300, "b": 300, "c": 300})
    assert plan.warm == ("a", "b", "c") and plan.cold == ()
    assert plan.worst_mib == {"exclusive": 4500, "gpushare": 2 * (2000 + 2 * 300) + 500}
    assert plan.to_json()["idle_mib"] == {"a": 300, "b": 300, "c": 300}
    assert plan.release  # the warm processes are told to give back
    # Where everything fits held whole, nothing is given back (the runs before 51 measured so).
    roomy = _plan(jobs, needs, memory, gpu_mib=20_000, idle={"a": 300, "b": 300, "c": 300})
    assert roomy.cold == () and not roomy.release and roomy.idle_mib == {}
    assert roomy.worst_mib["gpushare"] == 2 * 3 * 2000 + 500
    # Without a figure (a dry run, a failed measurement) nothing is given back, as before.
    assert _plan(jobs, needs, memory, idle={"c": 300}).cold == ("b",)
    # A figure above the job's own memory counts as that memory.
    assert _plan(jobs, needs, memory, idle={"a": 9000}).idle_mib == {}


def test_a_memory_limit_caps_what_a_warm_process_is_counted_for() -> None:
    jobs = [_job("a", "resnet50", 0.0)]
    # Three settings capped at 1000 MiB each hold 3000, not 3 x 4000.
    plan = _plan(jobs, [_need("gpushare", {"a": [1000, 1000, 1000]})], {"a": 4000})
    assert plan.warm == ("a",) and plan.worst_mib["gpushare"] == 3000


def test_a_trace_whose_jobs_together_do_not_fit_starts_every_job_cold() -> None:
    jobs = [_job(x, "resnet50_xl", i) for i, x in enumerate("abc")]
    plan = _plan(jobs, [_need("mps_unlimited", {j.id: [None] for j in jobs})],
                 {"a": 4000, "b": 4000, "c": 4000})  # fmt: skip
    assert plan.warm == () and plan.cold == ("a", "b", "c")
    assert all("do not fit" in why for why in plan.why_cold.values())


def test_warm_processes_stay_within_one_mps_servers_clients() -> None:
    jobs = [_job(f"j{i:02d}", "resnet18", i * 0.1) for i in range(20)]
    three = _need("gpushare", {j.id: [None, None, None] for j in jobs})
    plan = _plan(jobs, [three], {j.id: 1 for j in jobs})
    # Each warm job is 3 clients, each cold one 1: 14 warm + 6 cold = 48.
    assert len(plan.warm) == 14 and "48 MPS clients" not in plan.why_cold[plan.cold[0]]
    assert "49 MPS clients" not in plan.to_json()["why_cold"].values()
    assert plan.why_cold[plan.cold[0]].endswith("(at most 48)")


def test_a_kind_without_any_memory_figure_is_refused() -> None:
    jobs = [_job("a", "notebook", 0.0)]
    memory, source = warmup.job_memory(jobs, measured={"notebook": 900}, declared={})
    assert memory == {"a": 900} and source == {"notebook": "measured"}
    # The larger figure counts: a client measured under MPS leaves out its CUDA context.
    memory, source = warmup.job_memory(jobs, measured={"notebook": 900},
                                       declared={"notebook": 1160})  # fmt: skip
    assert memory == {"a": 1160} and source == {"notebook": "declared"}
    memory, source = warmup.job_memory(jobs, measured={"notebook": 1500},
                                       declared={"notebook": 1160})  # fmt: skip
    assert memory == {"a": 1500} and source == {"notebook": "measured"}
    with pytest.raises(ValueError, match="no memory figure for kind 'notebook'"):
        warmup.job_memory(jobs, measured={}, declared={})


def test_one_warm_process_stands_in_for_the_larger_memory_limits_of_its_setting() -> None:
    job = _job("a", "transformer", 0.0)
    env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}

    def launch(threads: int, memory: int) -> Launch:
        pinned = {**env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={memory}M"}
        return Launch(job, thread_percent=threads, memory_limit_mib=memory, env=pinned)

    variants = [launch(100, 40_000), launch(100, 20_000), launch(100, 7_000), launch(50, 40_000)]
    # The 5000-MiB job: the 7000-MiB limit holds it and stands in for 20000 and 40000.
    warmed = warm_launches(variants, memory_mib=5000)
    assert [(x.thread_percent, x.memory_limit_mib) for x in warmed] == [(100, 7000), (50, 40000)]
    # A job no limit of the setting holds gets the largest (its launch fails as it would).
    assert warm_launches(variants[:3], memory_mib=50_000)[0].memory_limit_mib == 40_000


class TwoLimits(TimeSlice):
    """Prepares two memory limits per job and launches each with the larger."""

    mps = True

    def _launch(self, job: TraceJob, memory: int) -> Launch:
        env = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={memory}M"}
        return Launch(job, thread_percent=100, memory_limit_mib=memory, env=env)

    def prepare(self, job: TraceJob) -> list[Launch]:
        return [self._launch(job, 4000), self._launch(job, 2000)]

    def select(self, pending: Any, running: Any) -> list[Launch]:
        return [self._launch(j, 4000) for j in pending]


def test_a_launch_with_a_larger_memory_limit_runs_in_the_warm_process_of_its_setting(
    tmp_path: Path,
) -> None:
    out = run_trace(
        scheme=TwoLimits(),
        jobs=[_job("a", "resnet18", 0.0)],
        iterations={"a": 5},
        workers=_workers(tmp_path),
        pipe_dir=tmp_path,
        timeout_s=60,
        warm_ids={"a"},
        memory_mib={"a": 1000},
    )
    (a,) = out
    assert a.ok and a.cold_starts == 0, (a.error, a.note)
    assert a.note is not None and "memory limit of 2000 MiB for the 4000 MiB chosen" in a.note


# --- the whole run without a GPU ------------------------------------------------------------

BY_TRACE_FIELDS = {
    "makespan_vs_mps_unlimited",
    "makespan_vs_exclusive",
    "jct_vs_best_other",
    "jct_floor_vs_best_other",
    "pauses",
    "paused_s",
    "discarded_gpu_s",
    "cold_starts",
}


def test_a_dry_run_runs_every_scheme_and_way_and_records_how_each_job_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CPU-only check of the harness (docs/benchmarks-gpu.md): workers sleep for work.
    trace = tmp_path / "tiny.json"
    trace.write_text(json.dumps([
        {"arrival_s": 0.0, "kind": "resnet18", "work_s": 0.4},
        {"arrival_s": 0.1, "kind": "notebook", "work_s": 1.2, "opportunistic": True},
        {"arrival_s": 0.2, "kind": "lstm", "work_s": 0.4},
    ]))  # fmt: skip
    out = tmp_path / "out"
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the workers import bench from this checkout
    argv = ["--out", str(out), "--dry", "--quick", "--resume", "auto", "--latency-rounds", "0",
            "--trace", str(trace), "--budget-s", "200"]  # fmt: skip
    assert run.main(argv) == 0
    results = json.loads((out / "gpu-packing.json").read_text())
    assert set(results["traces"]["tiny"]) == set(report.SCHEMES)
    for scheme, row in results["traces"]["tiny"].items():
        assert row["makespan_s"] is not None, scheme
        assert {"cold_starts", "pauses", "paused_s", "discarded_gpu_s"} <= set(row)
        assert results["details"]["schemes"]["tiny"][scheme]["failed"] == []
    plan = results["details"]["warm_plans"]["tiny"]
    assert sorted(plan["warm"] + plan["cold"]) == ["tiny00-resnet18", "tiny01-notebook",
                                                   "tiny02-lstm"]  # fmt: skip
    ways = [(r["way"], r["scheme"]) for r in results["by_trace"]]
    assert ways == [("defaults", "gpushare"), ("marked", "gpushare_opportunistic"),
                    ("every batch row", "gpushare_opportunistic_all")]  # fmt: skip
    assert all(set(r) >= BY_TRACE_FIELDS for r in results["by_trace"])
    assert any(t["target"].startswith("tiny, every batch row: makespan / MPS without limits")
               for t in results["targets"])  # fmt: skip
    assert "memory_mib" in json.loads((out / "phase-a.json").read_text())
    assert "## Per trace and way" in (out / "gpu-packing.md").read_text()
