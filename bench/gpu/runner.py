"""Executes schemes and colocation stages on the GPU with worker processes."""

import logging
import os
import queue
import signal
import time
import zlib
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu.colocate import Member, PackResult, Stage
from bench.gpu.metrics import JobResult
from bench.gpu.mps import client_env
from bench.gpu.procs import Worker, WorkerError, Workers, close_together
from bench.gpu.schemes import Launch, Running, Scheme
from bench.gpu.traces import TraceJob
from gpushare.api.pause import REASON_GUARANTEED, REASON_HARM
from gpushare.api.profile import GpuProfile
from gpushare.packing.model import Pause

log = logging.getLogger("bench.gpu")

SPAWN_TIMEOUT_S = 240.0
INIT_TIMEOUT_S = 180.0


def _env(scheme: Scheme, launch: Launch, pipe_dir: Path | None) -> dict[str, str]:
    """The client environment of ``launch``: gpushare's own limits when it made them (the
    device plugin's env), else the baseline's cap; no MPS for non-MPS schemes or launches."""
    if not scheme.mps or launch.mps is False:
        return {}
    if launch.env is not None:
        assert pipe_dir is not None
        return {"CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir), **launch.env}
    return client_env(
        pipe_dir=pipe_dir,
        thread_percent=launch.thread_percent,
        priority=launch.priority,
        memory_limit_mib=launch.memory_limit_mib,
    )


@dataclass
class Governing:
    """The GPU's counters fed to the scheme's governor while a trace runs (the controller's
    governor loop reads the node agent's ``/profile`` the same way, every period)."""

    profile_last: Callable[[float], GpuProfile | None]
    """The product's profile of the GPU over the last so many seconds."""
    period_s: float
    window_s: float


def run_trace(
    *,
    scheme: Scheme,
    jobs: Sequence[TraceJob],
    iterations: dict[str, int],
    workers: Workers,
    pipe_dir: Path | None,
    timeout_s: float,
    governing: Governing | None = None,
) -> list[JobResult]:
    """Run one trace under one scheme; every job is its own process, started and warmed up
    (CUDA context, model, two iterations) before the clock starts, once for each setting its
    scheme may give it (``Scheme.prepare``). A job whose process fails to start is recorded as
    failed and the trace goes on without it."""
    if scheme.mps and pipe_dir is None:
        raise ValueError(f"scheme {scheme.name} needs the MPS daemon's pipe directory")
    results = {
        j.id: JobResult(j.id, j.kind, j.gpu_class, j.arrival_s, iterations[j.id]) for j in jobs
    }
    warm: dict[str, list[tuple[Launch, Worker]]] = {j.id: [] for j in jobs}
    try:
        planned = [(j, i, launch) for j in jobs for i, launch in enumerate(scheme.prepare(j))]
        # Two waves: every job's first setting, then the others. Warm processes hold GPU
        # memory; a later setting that no longer fits is left cold (started when chosen)
        # instead of crowding out a job's first one.
        for wave in ([p for p in planned if p[1] == 0], [p for p in planned if p[1] > 0]):
            _warm_up(scheme, wave, results=results, warm=warm, workers=workers, pipe_dir=pipe_dir)
        for j in jobs:
            if warm[j.id]:
                results[j.id].error = None
        _drive(
            scheme=scheme,
            jobs=[j for j in jobs if warm[j.id]],
            results=results,
            warm=warm,
            workers=workers,
            pipe_dir=pipe_dir,
            timeout_s=timeout_s,
            governing=governing,
        )
    finally:
        workers.close_all()
    return [results[j.id] for j in jobs]


def _warm_up(
    scheme: Scheme,
    planned: Sequence[tuple[TraceJob, int, Launch]],
    *,
    results: dict[str, JobResult],
    warm: dict[str, list[tuple[Launch, Worker]]],
    workers: Workers,
    pipe_dir: Path | None,
) -> None:
    if not planned:
        return
    labels = [f"{scheme.name}.{j.id}.{i}" for j, i, _ in planned]
    started = workers.start_many(labels, timeout_s=SPAWN_TIMEOUT_S)
    for (j, _, launch), w in zip(planned, started, strict=True):
        w.send({"cmd": "init", "kind": j.kind, "env": _env(scheme, launch, pipe_dir)})
    for (j, i, launch), w in zip(planned, started, strict=True):
        try:
            ready = workers.expect(w, "ready", timeout_s=INIT_TIMEOUT_S)
        except WorkerError as exc:
            if i > 0:
                log.warning("[%s] %s: setting %d left cold: %s", scheme.name, j.id, i, exc)
                w.ask_to_quit()
                continue
            results[j.id].error = f"start-up failed: {exc}"
            log.error("[%s] %s: %s", scheme.name, j.id, results[j.id].error)
            continue
        results[j.id].init_s = results[j.id].init_s or float(ready["init_s"])
        warm[j.id].append((launch, w))


def _pick(
    scheme: Scheme, launch: Launch, warm: list[tuple[Launch, Worker]], workers: Workers,
    pipe_dir: Path | None,
) -> tuple[Worker, str | None]:  # fmt: skip
    """The warmed-up process started with ``launch``'s settings; the others are let go. With
    none, a new process starts now, inside the clock (noted on the job)."""
    chosen = next((w for settings, w in warm if launch.same_settings(settings)), None)
    for _, w in warm:
        if w is not chosen:
            w.ask_to_quit()
    warm.clear()  # used or let go: a preempted job starts again cold, as a new pod would
    if chosen is not None:
        return chosen, None
    note = (
        f"{scheme.name} chose {launch.settings()}, which no warmed-up process had "
        f"({[s.settings() for s, _ in warm]}): started cold, start-up inside the clock"
    )
    w = workers.start_many([f"{scheme.name}.{launch.job.id}.cold"], timeout_s=SPAWN_TIMEOUT_S)[0]
    w.send({"cmd": "init", "kind": launch.job.kind, "env": _env(scheme, launch, pipe_dir)})
    workers.expect(w, "ready", timeout_s=INIT_TIMEOUT_S)
    return w, note


def _drive(
    *,
    scheme: Scheme,
    jobs: Sequence[TraceJob],
    results: dict[str, JobResult],
    warm: dict[str, list[tuple[Launch, Worker]]],
    workers: Workers,
    pipe_dir: Path | None,
    timeout_s: float,
    governing: Governing | None = None,
) -> None:
    """The trace's clock: arrivals, the scheme's resumptions, promotions, launches, pauses and
    evictions, completions. A paused job's process is stopped (SIGSTOP: as the node agent's
    cgroup freeze, its MPS client gives its SMs back and keeps its memory; measured alike in
    issue 65) and continued when the scheme resumes it; an evicted job's process is ended and
    the job waits again, to start from scratch (its run so far counted in
    ``discarded_gpu_s``). A job that crashes is recorded as failed; the others go on."""
    arrivals = sorted(jobs, key=lambda j: j.arrival_s)
    pending: list[TraceJob] = []
    running: dict[str, Running] = {}
    label_job: dict[str, TraceJob] = {}
    worker_of: dict[str, Worker] = {}
    t0 = time.time() + 0.2
    deadline = t0 + timeout_s
    next_review = t0 + (governing.period_s if governing else 0.0)

    paused_in_run: dict[str, float] = {}
    """Seconds each running job spent paused since it last started."""

    def signal_worker(job_id: str, sig: signal.Signals) -> None:
        proc = worker_of[job_id].proc
        if proc.poll() is None:
            os.kill(proc.pid, sig)

    def pause(job_id: str, reason: str, why: str, beside: tuple[str, ...] = ()) -> None:
        r = running.get(job_id)
        if r is None or r.pause is not None:
            return
        signal_worker(job_id, signal.SIGSTOP)
        now = time.time() - t0
        r.pause = Pause(reason, now, frozenset(beside))
        results[job_id].pauses += 1
        log.info("[%s] t=%6.2fs pause %s: %s", scheme.name, now, job_id, why)

    def resume(job_id: str) -> None:
        r = running.get(job_id)
        if r is None or r.pause is None:
            return
        signal_worker(job_id, signal.SIGCONT)
        now = time.time() - t0
        results[job_id].paused_s += now - r.pause.since
        paused_in_run[job_id] = paused_in_run.get(job_id, 0.0) + now - r.pause.since
        r.pause, r.resumed_s = None, now
        log.info("[%s] t=%6.2fs resume %s", scheme.name, now, job_id)

    def evict(job_id: str, reason: str) -> None:
        resume(job_id)  # a stopped process takes its SIGTERM only once continued
        r = running.pop(job_id, None)
        if r is None:
            return
        res = results[job_id]
        res.preemptions.append(reason)
        if r.start_s is not None:
            ran = time.time() - t0 - r.start_s - paused_in_run.get(job_id, 0.0)
            res.discarded_gpu_s += max(0.0, ran)
        paused_in_run.pop(job_id, None)
        worker = worker_of.pop(job_id)
        label_job.pop(worker.label, None)
        if worker.proc.poll() is None:
            worker.proc.terminate()  # an eviction's SIGTERM
        pending.append(r.job)
        pending.sort(key=lambda j: j.arrival_s)
        log.info("[%s] t=%6.2fs evict %s: %s", scheme.name, time.time() - t0, job_id, reason)

    while arrivals or pending or running:
        now = time.time()
        while arrivals and arrivals[0].arrival_s <= now - t0:
            pending.append(arrivals.pop(0))
        for job_id in scheme.resumptions(list(running.values())):
            resume(job_id)
        for job_id in scheme.promotions(list(running.values())):
            if job_id in running and not running[job_id].promoted:
                running[job_id].promoted = True
                results[job_id].promoted_s = now - t0
                log.info("[%s] t=%6.2fs promote %s", scheme.name, now - t0, job_id)
        for launch in scheme.select(list(pending), list(running.values())):
            job = launch.job
            res = results[job.id]
            for victim in launch.evict:
                evict(victim, f"{job.id} (guaranteed) needs the GPU memory it holds")
            for victim in launch.pause:
                pause(
                    victim, REASON_GUARANTEED, f"{job.id} (guaranteed) needs the compute", (job.id,)
                )
            pending.remove(job)
            try:
                worker, note = _pick(scheme, launch, warm[job.id], workers, pipe_dir)
            except WorkerError as exc:
                res.error = f"cold start failed: {exc}"
                scheme.finished(job)
                continue
            res.start_s = time.time() - t0
            if res.first_start_s is None:
                res.first_start_s = res.start_s
            res.thread_percent = launch.thread_percent
            res.priority = launch.priority
            res.opportunistic = launch.opportunistic
            res.note = note or launch.note or None
            if note:
                log.warning("[%s] %s: %s", scheme.name, job.id, note)
            seed = zlib.crc32(job.id.encode()) % 10_000
            label_job[worker.label] = job
            worker_of[job.id] = worker
            try:
                worker.send({"cmd": "run", "iterations": res.iterations, "seed": seed})
            except WorkerError as exc:
                res.error = str(exc)
                scheme.finished(job)
                continue
            running[job.id] = Running(job, launch, res.start_s)
            paused_in_run[job.id] = 0.0
            log.info(
                "[%s] t=%6.2fs start %s threads=%s prio=%s%s",
                scheme.name,
                res.start_s,
                job.id,
                launch.thread_percent,
                launch.priority,
                f" ({launch.note})" if launch.note else "",
            )
        if governing is not None and time.time() >= next_review:
            next_review = time.time() + governing.period_s
            measured = governing.profile_last(governing.window_s)
            if measured is not None:
                verdict = scheme.review(list(running.values()), measured, time.time() - t0)
                if verdict is not None:
                    pause(verdict.job, REASON_HARM, verdict.reason, verdict.beside)
        if time.time() > deadline:
            for jid in list(running) + [j.id for j in pending + arrivals]:
                results[jid].error = f"not finished within {timeout_s:.0f}s"
            for jid in list(running):
                resume(jid)  # never leave a stopped process behind
            return
        wait = 0.25 if governing is None else min(0.25, governing.period_s)
        if arrivals:
            wait = max(0.0, min(wait, t0 + arrivals[0].arrival_s - time.time()))
        try:
            ev = workers.all_events.get(timeout=wait)
        except queue.Empty:
            continue
        job_for = label_job.get(ev.label)
        if job_for is None or job_for.id not in running:
            continue
        res = results[job_for.id]
        if ev.name == "done":
            res.end_s = ev.fields["t_end"] - t0
            res.latencies_ms = list(ev.fields.get("latencies_ms", []))
            peak = ev.fields.get("peak_mib")
            res.peak_mib = int(peak) if isinstance(peak, int | float) else None
            held = ev.fields.get("process_mib")
            res.process_mib = int(held) if isinstance(held, int | float) else None
        elif ev.name in ("error", "exit"):
            res.error = f"{ev.name}: {ev.fields} {workers.workers[ev.label].tail(3)}"
            log.error("[%s] %s failed: %s", scheme.name, job_for.id, res.error)
        else:
            continue
        del running[job_for.id]
        paused_in_run.pop(job_for.id, None)
        worker_of.pop(job_for.id, None)
        scheme.finished(job_for)
        if res.ok:
            log.info(
                "[%s] t=%6.2fs end   %s (run %.2fs)", scheme.name, res.end_s, job_for.id, res.run_s
            )


@dataclass
class Pool:
    """Long-lived rate workers keyed by Member, initialised with their MPS settings."""

    workers: Workers
    pipe_dir: Path | None
    live: dict[Member, Worker]
    failed: dict[Member, str] = field(default_factory=dict)

    def ensure(
        self,
        members: set[Member],
        *,
        priority: Callable[[Member], int | None],
        no_mps: AbstractSet[Member] = frozenset(),
    ) -> dict[Member, str]:
        """Close workers not in ``members``, start and initialise the missing ones (those in
        ``no_mps`` outside the MPS daemon). Returns the members that failed to start, with why:
        their packs are skipped, the others measured."""
        gone = [m for m in self.live if m not in members]
        close_together([self.live.pop(m) for m in gone])
        for m in gone:
            self.workers.workers.pop(m.label, None)
        missing = sorted(members - set(self.live) - set(self.failed), key=lambda m: m.label)
        if not missing:
            return dict(self.failed)
        started = self.workers.start_many([m.label for m in missing], timeout_s=SPAWN_TIMEOUT_S)
        for m, w in zip(missing, started, strict=True):
            env = client_env(
                pipe_dir=None if m in no_mps else self.pipe_dir,
                thread_percent=m.thread_percent if m.thread_percent < 100 else None,
                priority=priority(m),
            )
            w.send({"cmd": "init", "kind": m.kind, "env": env})
        for m, w in zip(missing, started, strict=True):
            try:
                self.workers.expect(w, "ready", timeout_s=INIT_TIMEOUT_S)
            except WorkerError as exc:
                self.failed[m] = str(exc)
                log.error("worker %s failed to start: %s", m.label, exc)
                continue
            self.live[m] = w
        return dict(self.failed)

    def window(
        self, members: Sequence[Member], *, seconds: float, seed: int = 0, settle: bool = False
    ) -> list[dict[str, Any]]:
        """Run ``members`` together for ``seconds``; each reports its own rate (a latency
        service with ``settle`` leaves out its warm-up requests, ``worker.settled_after``)."""
        start = time.time() + 0.15
        for m in members:
            self.live[m].send(
                {
                    "cmd": "window",
                    "start": start,
                    "end": start + seconds,
                    "seed": seed,
                    "settle": settle,
                }
            )
        return [
            self.workers.expect(self.live[m], "window", timeout_s=seconds + 60) for m in members
        ]

    def close(self) -> None:
        close_together(list(self.live.values()))
        self.live.clear()
        self.workers.close_all()


def measure_stages(
    *,
    pool: Pool,
    stages: Sequence[Stage],
    deadline: float,
    on_solo: Callable[[Member, float, float, float], None],
) -> list[PackResult]:
    """Measure every pack of every stage until ``deadline`` (then the rest is skipped).

    ``on_solo(member, start, end, rate)`` is called after each single-job window at 100%
    threads, while the GPU still holds only that job's recent history (for its profile).
    """
    results: list[PackResult] = []
    for stage in stages:
        if time.time() > deadline:
            log.warning("colocation stage %s skipped: out of time", stage.name)
            continue
        failed = pool.ensure(stage.members, priority=lambda m: None)
        for i, pack in enumerate(stage.packs):
            if any(m in failed for m in pack):
                continue
            if time.time() > deadline:
                log.warning(
                    "stage %s: %d packs skipped, out of time", stage.name, len(stage.packs) - i
                )
                break
            t_start = time.time()
            reports = pool.window(list(pack), seconds=stage.window_s, seed=i)
            rates = tuple(float(r["rate"]) for r in reports)
            results.append(PackResult(pack, rates))
            if len(pack) == 1 and pack[0].thread_percent == 100:
                on_solo(pack[0], t_start, time.time(), rates[0])
            log.info(
                "pack %-60s rates %s",
                "+".join(m.label for m in pack),
                ", ".join(f"{r:.1f}" for r in rates),
            )
    return results


def safe(fn: Callable[[], Any], what: str, errors: list[str]) -> Any:
    """Run one phase; a failure is logged and recorded, and the run goes on."""
    try:
        return fn()
    except Exception as exc:  # one phase failing must not lose the others
        log.exception("%s failed", what)
        errors.append(f"{what}: {type(exc).__name__}: {exc}")
        return None
