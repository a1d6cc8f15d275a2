"""The GPU benchmark carries out the product's pauses (issue 65): the trace's clock stops a
paused job's process (SIGSTOP, as the node agent's freeze stops its cgroup) and continues it
when the scheme resumes it, counting pauses and paused seconds; an eviction ends the process
and counts the GPU-seconds of work it threw away. Real processes stand in for the GPU jobs."""

import queue
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from bench.gpu.metrics import JobResult, summarize
from bench.gpu.procs import Event, Worker
from bench.gpu.runner import _drive
from bench.gpu.schemes import Launch, Running, Scheme
from bench.gpu.traces import TraceJob
from gpushare.api.pause import REASON_GUARANTEED
from gpushare.packing.model import Pause
from gpushare.packing.opportunistic import Opportunism
from tests.unit.bench.test_bench_gpu import decider, job

RUN_S = 0.6
"""How long the guaranteed job runs before it reports done."""


def state(pid: int) -> str:
    """The process's state letter in /proc (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


class StandIns:
    """What ``_drive`` reads of ``bench.gpu.procs.Workers``, over processes that only sleep."""

    def __init__(self, tmp: Path) -> None:
        self.all_events: queue.Queue[Event] = queue.Queue()
        self.workers: dict[str, Worker] = {}
        self.tmp = tmp

    def worker(self, label: str) -> Worker:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time\nwhile True: time.sleep(0.02)"],
            stdin=subprocess.PIPE,
            text=True,
        )
        w = Worker(label=label, proc=proc, stderr_path=self.tmp / f"{label}.stderr")
        self.workers[label] = w
        return w

    def start_many(self, labels: Sequence[str], *, timeout_s: float) -> list[Worker]:
        """A job started again after an eviction (cold: no warmed-up process left)."""
        return [self.worker(label) for label in labels]

    def expect(self, worker: Worker, name: str, *, timeout_s: float) -> dict[str, object]:
        return {}

    def done(self, label: str) -> None:
        self.all_events.put(Event(label, "done", {"t_end": time.time()}))

    def close(self) -> None:
        for w in self.workers.values():
            w.proc.kill()
            w.proc.wait()


class Script(Scheme):
    """Starts the opted-in job at once; the guaranteed one, when it arrives, ``evict``s or
    pauses it; the paused job is resumed once the guaranteed one is gone. Reports each job
    done as the real worker would, and what state the first job's process was in meanwhile."""

    name = "script"

    def __init__(self, workers: StandIns, *, evict: bool) -> None:
        self.workers, self.evict = workers, evict
        self.reported: set[str] = set()
        self.seen: list[str] = []
        self.started: dict[str, float] = {}

    def select(self, pending: Sequence[TraceJob], running: Sequence[Running]) -> list[Launch]:
        now = time.time()
        ids = {r.job.id for r in running}
        for r in running:
            self.started.setdefault(r.job.id, now)
            if r.job.id == "opp" and "opp" in self.workers.workers:
                self.seen.append(state(self.workers.workers["opp"].proc.pid))
            if r.job.id == "g" and now - self.started["g"] > RUN_S:
                self._done("g")
            if r.job.id == "opp" and "g" in self.reported and "g" not in ids and r.pause is None:
                self._done("opp")
        out = []
        for waiting in pending:
            if waiting.id == "opp" and "g" not in ids:
                self.started.pop("opp", None)
                out.append(Launch(waiting, opportunistic=True))
            if waiting.id == "g":
                out.append(
                    Launch(waiting, evict=("opp",))
                    if self.evict
                    else Launch(waiting, pause=("opp",))
                )
        return out

    def resumptions(self, running: Sequence[Running]) -> list[str]:
        ids = {r.job.id for r in running}
        return [r.job.id for r in running if r.pause is not None and "g" not in ids]

    def _done(self, job: str) -> None:
        if job not in self.reported:
            self.reported.add(job)
            cold = f"{self.name}.{job}.cold"  # started again after an eviction
            self.workers.done(cold if cold in self.workers.workers else job)


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[StandIns]:
    stand_ins = StandIns(tmp_path)
    yield stand_ins
    stand_ins.close()


def drive(workers: StandIns, scheme: Script) -> dict[str, JobResult]:
    jobs = [TraceJob("opp", "lstm", 0.0, 1.0), TraceJob("g", "lstm", 0.4, 1.0)]
    results = {j.id: JobResult(j.id, j.kind, "batch", j.arrival_s, 1) for j in jobs}
    warm = {j.id: [(Launch(j), workers.worker(j.id))] for j in jobs}
    _drive(
        scheme=scheme,
        jobs=jobs,
        results=results,
        warm=warm,
        workers=workers,  # type: ignore[arg-type]
        pipe_dir=None,
        timeout_s=20.0,
    )
    return results


def test_a_paused_job_is_stopped_while_the_guaranteed_job_runs_then_finishes_its_work(
    workers: StandIns,
) -> None:
    scheme = Script(workers, evict=False)
    results = drive(workers, scheme)
    opp = results["opp"]
    assert opp.ok and results["g"].ok
    assert "T" in scheme.seen and scheme.seen[-1] != "T"  # stopped, then running again
    assert opp.pauses == 1 and RUN_S * 0.8 < opp.paused_s < RUN_S + 2.0
    assert opp.discarded_gpu_s == 0.0 and opp.preemptions == []
    assert opp.first_start_s == opp.start_s  # never started over
    summary = summarize(list(results.values()), solo_run_s={})
    assert summary["pauses"] == 1 and summary["discarded_gpu_s"] == 0.0


def test_an_evicted_job_starts_over_and_its_lost_gpu_seconds_are_counted(
    workers: StandIns,
) -> None:
    results = drive(workers, Script(workers, evict=True))
    opp = results["opp"]
    assert opp.ok and results["g"].ok
    assert opp.pauses == 0 and len(opp.preemptions) == 1
    assert 0.2 < opp.discarded_gpu_s < 2.0  # it ran from 0 until g arrived at 0.4 s
    assert opp.first_start_s is not None and opp.start_s is not None
    assert opp.start_s > opp.first_start_s


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
