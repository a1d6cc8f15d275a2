"""The GPU benchmark carries out the product's pauses (issue 65): the trace's clock freezes a
paused job's process (SIGSTOP, as the node agent's freeze stops its cgroup) and lets it go on
when the scheme resumes it, counting pauses and paused seconds; an eviction ends the process
and counts the work it threw away. Real worker processes, the dry-run stand-in (no GPU)."""

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from bench.gpu import report
from bench.gpu.metrics import JobResult, summarize
from bench.gpu.procs import Workers
from bench.gpu.runner import run_trace
from bench.gpu.schemes import Launch, Running, Scheme
from bench.gpu.traces import TraceJob
from gpushare.api.pause import REASON_GUARANTEED
from gpushare.packing.model import Pause
from gpushare.packing.opportunistic import Opportunism
from tests import REPO
from tests.unit.bench.test_bench_gpu import decider, job


def state(pid: int) -> str:
    """The process's state letter in /proc (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


class Script(Scheme):
    """Starts the opted-in job at once; the guaranteed one, when it arrives, evicts or pauses
    it (as ``Assignment.evict`` / ``pause`` say); the paused job is resumed once the guaranteed
    one is gone, an evicted one started again. Records the first job's process state."""

    name = "script"

    def __init__(self, workers: Workers, *, evict: bool) -> None:
        self.workers, self.evict = workers, evict
        self.seen: list[str] = []

    def select(self, pending: Sequence[TraceJob], running: Sequence[Running]) -> list[Launch]:
        ids = {r.job.id for r in running}
        for w in self.workers.workers.values():
            if ".opp." in w.label and w.proc.poll() is None and "opp" in ids:
                self.seen.append(state(w.proc.pid))
        out = []
        for waiting in pending:
            if waiting.id == "opp" and "g" not in ids:
                out.append(Launch(waiting, opportunistic=True))
            if waiting.id == "g":
                victims = ("opp",) if "opp" in ids else ()
                out.append(
                    Launch(waiting, evict=victims) if self.evict else Launch(waiting, pause=victims)
                )
        return out

    def resumptions(self, running: Sequence[Running]) -> list[str]:
        ids = {r.job.id for r in running}
        return [r.job.id for r in running if r.pause is not None and "g" not in ids]


def trace(tmp_path: Path, *, evict: bool) -> tuple[Script, dict[str, JobResult]]:
    workers = Workers(device="sleep", tiny=False, log_dir=tmp_path,
                      base_env={"PYTHONPATH": str(REPO)})  # fmt: skip
    scheme = Script(workers, evict=evict)
    # opp: 60 steps of 20 ms; g arrives at 0.4 s and runs 100 steps of 4 ms.
    jobs = [TraceJob("opp", "resnet50", 0.0, 1.0), TraceJob("g", "resnet18", 0.4, 1.0)]
    out = run_trace(
        scheme=scheme,
        jobs=jobs,
        iterations={"opp": 60, "g": 100},
        workers=workers,
        pipe_dir=None,
        timeout_s=60,
        warm_ids={"opp", "g"},
    )
    return scheme, {r.id: r for r in out}


def test_a_paused_job_is_frozen_while_the_guaranteed_job_runs_then_finishes_its_work(
    tmp_path: Path,
) -> None:
    scheme, results = trace(tmp_path, evict=False)
    opp, g = results["opp"], results["g"]
    assert opp.ok and g.ok, (opp.error, g.error)
    assert "T" in scheme.seen and scheme.seen[-1] != "T"  # frozen, then going on
    assert opp.pauses == 1 and 0.2 < opp.paused_s < 5.0
    assert opp.discarded_s == 0.0 and opp.preemptions == []
    assert opp.first_start_s == opp.start_s  # never started over
    assert opp.end_s is not None and g.end_s is not None and opp.end_s > g.end_s
    summary = summarize(list(results.values()), solo_run_s={})
    assert summary["pauses"] == 1 and summary["discarded_gpu_s"] == 0.0


def test_an_evicted_job_starts_over_and_the_work_it_lost_is_counted(tmp_path: Path) -> None:
    scheme, results = trace(tmp_path, evict=True)
    opp = results["opp"]
    assert opp.ok and results["g"].ok, (opp.error, results["g"].error)
    assert opp.pauses == 0 and len(opp.preemptions) == 1 and "T" not in scheme.seen
    assert 0.1 < opp.discarded_s < 2.0  # it had worked from its start until g arrived
    assert opp.cold_starts == 1  # its restart, as a new pod's


def test_the_decider_counts_a_paused_job_as_the_product_counts_a_paused_pod() -> None:
    d = replace(decider(), opportunism=Opportunism())
    opted = job("o", "resnet18", 0.6, opportunistic=True)
    paused = Running(opted, Launch(opted, opportunistic=True), 0.0, pause=Pause(REASON_GUARANTEED))
    gpu = d.gpu([paused])
    assert gpu.tenants[0].paused and gpu.tenants[0].opted_in
    assert gpu.running().tenants == []
    # Nothing in its way any more: the product's resumption rule lets it run.
    assert d.resumptions([paused]) == ["o"]
    assert d.resumptions([replace(paused, pause=None)]) == []


def test_with_the_chart_default_rows_gpushare_sizes_opt_in_and_rows_with_a_fraction_do_not() -> (
    None
):
    d = replace(decider(), opportunism=Opportunism(), opportunistic_default=True)
    sized = job("s", "resnet18", 0.15)
    stated = replace(job("f", "resnet18", 0.15), fixed_request=True)
    assert d.demand(sized).opportunistic and not d.demand(stated).opportunistic
    assert not replace(d, opportunistic_default=False).demand(sized).opportunistic


def test_a_job_that_opted_in_is_not_held_to_its_bound_when_placed_in_a_share() -> None:
    # With every batch row opted in, a job whose request fits is placed in a guaranteed share,
    # but it is one of the equals (no preemption among equals): issue 65's bound for
    # guaranteed jobs beside opportunistic ones is about jobs that did not opt in.
    d = replace(decider(), opportunism=Opportunism())
    opted = job("o", "resnet18", 0.3, opportunistic=True)
    launch = d(opted, [])
    assert isinstance(launch, Launch)
    assert launch.opted_in and not launch.opportunistic
    assert not d(job("g", "resnet18", 0.3), []).opted_in  # type: ignore[union-attr]

    def record(job_id: str, **kw: object) -> dict[str, object]:
        return {"id": job_id, "kind": "resnet18", "start_s": 0.0, "end_s": 3.0, **kw}

    beside = record("opp", opportunistic=True, opted_in=True)
    solo = {"g": 1.0, "opp": 1.0}
    assert report.guaranteed_beside_opportunistic([beside, record("g")], solo) == 3.0
    assert (
        report.guaranteed_beside_opportunistic([beside, record("g", opted_in=True)], solo) is None
    )
