"""Executes schemes and colocation stages on the GPU with worker processes."""

import logging
import math
import os
import queue
import signal
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bench.gpu.colocate import Member, PackResult, Stage
from bench.gpu.metrics import JobResult
from bench.gpu.mps import client_env
from bench.gpu.procs import Event, Worker, WorkerError, Workers, close_together
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


PINNED_MEMORY = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"


def _but_memory(launch: Launch) -> tuple[object, ...]:
    """A launch's settings less its MPS memory limit."""
    env = None
    if launch.env is not None:
        env = tuple(sorted((k, v) for k, v in launch.env.items() if k != PINNED_MEMORY))
    return (launch.thread_percent, launch.priority, env, launch.mps)


def _limit(launch: Launch) -> float:
    return math.inf if launch.memory_limit_mib is None else float(launch.memory_limit_mib)


def warm_launches(launches: Sequence[Launch], *, memory_mib: int | None) -> list[Launch]:
    """The processes warmed for a job that may start with any of ``launches``: one for each
    setting but its MPS memory limit, with the smallest of those limits that holds the job's
    ``memory_mib`` (else the largest). MPS's pinned-memory limit only caps what a client may
    allocate, so a job that runs within the smaller limit runs the same under a larger one:
    that process stands in for the larger limits of its setting (:meth:`ProcessStarter.start`;
    the product's own choice is what its accounting and the results record). Without this, an
    opted-in job was warmed once per memory step (issue 65's warm-up storm)."""
    groups: dict[tuple[object, ...], list[Launch]] = {}
    for launch in launches:
        groups.setdefault(_but_memory(launch), []).append(launch)
    out = []
    for group in groups.values():
        holds = [x for x in group if memory_mib is None or _limit(x) >= memory_mib]
        out.append(min(holds, key=_limit) if holds else max(group, key=_limit))
    return out


@dataclass
class Attempt:
    """One start of a job: the process doing it, and whether it started cold."""

    label: str
    cold: bool
    note: str | None = None


class Starter(Protocol):
    """Starts jobs for the trace's clock without making it wait: :meth:`start` returns at once
    and the process reports on :attr:`events` (``started`` when its work begins, then ``done``,
    or ``error``/``exit``)."""

    @property
    def events(self) -> "queue.Queue[Event]": ...

    def start(self, launch: Launch, *, iterations: int, seed: int) -> Attempt: ...

    def stop(self, label: str) -> None:
        """End an attempt's process now (an eviction's SIGTERM); returns at once."""

    def pause(self, label: str) -> None:
        """Freeze an attempt's process where it is (the node agent's cgroup freeze)."""

    def resume(self, label: str) -> None:
        """Let a frozen attempt's process go on where it stopped."""

    def tail(self, label: str) -> str:
        """The end of an attempt's stderr, for a failure's record."""


@dataclass
class ProcessStarter:
    """The real :class:`Starter`: a warm job's process matching the launch gets its work; any
    other start is cold, its CUDA context, model and warm-up inside the clock, in a process
    that imported its libraries before the clock (``spare``) or, for a restart, a new one.
    Nothing here waits for a process."""

    scheme: Scheme
    workers: Workers
    pipe_dir: Path | None
    warm: dict[str, list[tuple[Launch, Worker]]]
    """Job id -> its warmed-up processes, one per setting (emptied when the job starts)."""
    spare: dict[str, Worker]
    """Job id -> a process that has imported torch, for the job's cold start."""
    failed: dict[str, list[tuple[Launch, str]]] = field(default_factory=dict)
    """Job id -> settings whose warm-up failed, and why."""
    init_s: dict[str, float] = field(default_factory=dict)
    """Job id -> the longest warm-up of its processes (paid before the clock)."""
    starts: int = 0

    @property
    def events(self) -> "queue.Queue[Event]":
        return self.workers.all_events

    def start(self, launch: Launch, *, iterations: int, seed: int) -> Attempt:
        job = launch.job
        warm = [(s, w) for s, w in self.warm.get(job.id, []) if w.proc.poll() is None]
        self.warm[job.id] = warm  # a warm process that died before its launch is no choice
        chosen = next((w for settings, w in warm if launch.same_settings(settings)), None)
        stand_in = None
        if chosen is None:  # the same setting with a smaller memory limit (warm_launches)
            stand_in = next(
                (
                    (s, w)
                    for s, w in warm
                    if _but_memory(s) == _but_memory(launch) and _limit(s) <= _limit(launch)
                ),
                None,
            )
            chosen = stand_in[1] if stand_in is not None else None
        for _, w in warm:
            if w is not chosen:
                w.ask_to_quit()
        offered = [s.settings() for s, _ in warm]
        warm.clear()  # used or let go: a preempted job starts again cold, as a new pod would
        if chosen is not None:
            chosen.send({"cmd": "run", "iterations": iterations, "seed": seed})
            note = None
            if stand_in is not None:
                note = (
                    f"warm process with a memory limit of {stand_in[0].memory_limit_mib} MiB "
                    f"for the {launch.memory_limit_mib} MiB chosen, otherwise the same settings"
                )
            return Attempt(chosen.label, cold=False, note=note)
        note = None
        failed = [why for s, why in self.failed.get(job.id, []) if launch.same_settings(s)]
        if failed:
            note = f"its warm-up with these settings failed ({failed[0][:200]}): started cold"
        elif offered:
            note = (
                f"{self.scheme.name} chose {launch.settings()}, which no warmed-up process had "
                f"({offered}): started cold"
            )
        worker = self.spare.pop(job.id, None)
        if worker is None or worker.proc.poll() is not None:
            self.starts += 1
            label = f"{self.scheme.name}.{job.id}.cold{self.starts}"
            worker = self.workers.spawn(label, preload=job.kind)
        env = _env(self.scheme, launch, self.pipe_dir)
        worker.send(
            {"cmd": "job", "kind": job.kind, "env": env, "iterations": iterations, "seed": seed}
        )
        return Attempt(worker.label, cold=True, note=note)

    def stop(self, label: str) -> None:
        worker = self.workers.workers.get(label)
        if worker is not None and worker.proc.poll() is None:
            worker.proc.terminate()

    def pause(self, label: str) -> None:
        self._signal(label, signal.SIGSTOP)

    def resume(self, label: str) -> None:
        self._signal(label, signal.SIGCONT)

    def _signal(self, label: str, sig: signal.Signals) -> None:
        """SIGSTOP / SIGCONT the job's process: as the node agent's cgroup v2 freeze, its MPS
        client gives its SMs back at once and keeps its GPU memory; thawed, it goes on where
        it stopped (both measured alike on an H100: docs/packing.md, "The sharing contract").
        The worker is one process (CUDA's threads are its own)."""
        worker = self.workers.workers.get(label)
        if worker is not None and worker.proc.poll() is None:
            os.kill(worker.proc.pid, sig)

    def tail(self, label: str) -> str:
        worker = self.workers.workers.get(label)
        return worker.tail(3) if worker is not None else ""


def run_trace(
    *,
    scheme: Scheme,
    jobs: Sequence[TraceJob],
    iterations: dict[str, int],
    workers: Workers,
    pipe_dir: Path | None,
    timeout_s: float,
    warm_ids: AbstractSet[str],
    memory_mib: Mapping[str, int] | None = None,
    governing: Governing | None = None,
    release: bool = False,
) -> list[JobResult]:
    """Run one trace under one scheme; every job is its own process. The jobs in
    ``warm_ids`` (``warmup.plan``, the same for every scheme) are started and warmed up (CUDA
    context, model, two iterations) before the clock starts, once for each setting the scheme
    may give them (``Scheme.prepare``, :func:`warm_launches` with the job's ``memory_mib``);
    the others start cold when launched, inside the clock, from a process that imported its
    libraries before it. No start makes the clock wait. With ``release`` (``WarmPlan.release``)
    each warm process gives its warm-up's activations back while it waits."""
    if scheme.mps and pipe_dir is None:
        raise ValueError(f"scheme {scheme.name} needs the MPS daemon's pipe directory")
    results = {
        j.id: JobResult(j.id, j.kind, j.gpu_class, j.arrival_s, iterations[j.id]) for j in jobs
    }
    try:
        starter = _warm_up(scheme, jobs, warm_ids=warm_ids, workers=workers, pipe_dir=pipe_dir,
                           memory_mib=memory_mib or {}, release=release)  # fmt: skip
        for job_id, seconds in starter.init_s.items():
            results[job_id].init_s = seconds
        drive(
            scheme=scheme,
            jobs=jobs,
            results=results,
            starter=starter,
            timeout_s=timeout_s,
            governing=governing,
        )
    finally:
        workers.close_all()
    return [results[j.id] for j in jobs]


def _warm_up(
    scheme: Scheme,
    jobs: Sequence[TraceJob],
    *,
    warm_ids: AbstractSet[str],
    workers: Workers,
    pipe_dir: Path | None,
    memory_mib: Mapping[str, int],
    release: bool = False,
) -> ProcessStarter:
    """Before the clock: a process per setting of every warm job, initialised with it, and an
    imported process for every cold job. Every process is spawned at once and an init waits
    in its pipe for the import, so no barrier separates the two."""
    planned = [
        (j, launch)
        for j in jobs
        if j.id in warm_ids
        for launch in warm_launches(scheme.prepare(j), memory_mib=memory_mib.get(j.id))
    ]
    starter = ProcessStarter(
        scheme, workers, pipe_dir, warm={j.id: [] for j in jobs}, spare={}, failed={}
    )
    started: list[tuple[TraceJob, Launch, Worker]] = []
    for i, (j, launch) in enumerate(planned):
        w = workers.spawn(f"{scheme.name}.{j.id}.warm{i}", preload=j.kind)
        env = _env(scheme, launch, pipe_dir)
        w.send({"cmd": "init", "kind": j.kind, "env": env, "release": release})
        started.append((j, launch, w))
    for j in jobs:
        if j.id not in warm_ids:
            starter.spare[j.id] = workers.spawn(f"{scheme.name}.{j.id}.cold0", preload=j.kind)
    deadline = time.monotonic() + SPAWN_TIMEOUT_S + INIT_TIMEOUT_S
    for j, launch, w in started:
        try:
            ready = workers.expect(w, "ready", timeout_s=max(1.0, deadline - time.monotonic()))
        except WorkerError as exc:
            log.warning("[%s] %s: warm-up with %s failed: %s", scheme.name, j.id,
                        launch.settings(), exc)  # fmt: skip
            starter.failed.setdefault(j.id, []).append((launch, str(exc)))
            w.ask_to_quit()
            continue
        seconds = float(ready.get("init_s", 0.0))
        starter.init_s[j.id] = max(seconds, starter.init_s.get(j.id, 0.0))
        starter.warm[j.id].append((launch, w))
    for job_id, w in list(starter.spare.items()):
        try:
            workers.expect(w, "imported", timeout_s=max(1.0, deadline - time.monotonic()))
        except WorkerError as exc:
            log.warning("[%s] %s: no process imported for its cold start (%s); one is started "
                        "when it launches", scheme.name, job_id, exc)  # fmt: skip
            del starter.spare[job_id]
    while not workers.all_events.empty():  # the warm-up's events are not the clock's
        workers.all_events.get_nowait()
    return starter


def drive(
    *,
    scheme: Scheme,
    jobs: Sequence[TraceJob],
    results: dict[str, JobResult],
    starter: Starter,
    timeout_s: float,
    governing: Governing | None = None,
) -> None:
    """The trace's clock: arrivals, the scheme's resumptions, promotions, launches, pauses and
    evictions, completions. A paused job's process is frozen (``Starter.pause``) and goes on
    when the scheme resumes it (pauses and paused seconds counted); an evicted job's process
    is ended and the job waits again, to start from scratch (the work it had done is counted
    as discarded, its paused time left out). A launch only asks ``starter`` to start
    the job and goes on: the job holds its place from the launch, and its work begins when its
    process says ``started``, so a slow start never delays another arrival or launch. A job
    that crashes is recorded as failed; the others go on."""
    arrivals = sorted(jobs, key=lambda j: j.arrival_s)
    pending: list[TraceJob] = []
    running: dict[str, Running] = {}
    label_job: dict[str, TraceJob] = {}
    attempt_of: dict[str, Attempt] = {}
    working_since: dict[str, float] = {}
    t0 = time.time() + 0.2
    deadline = t0 + timeout_s
    next_review = t0 + (governing.period_s if governing else 0.0)

    def pause(job_id: str, reason: str, why: str, beside: tuple[str, ...] = ()) -> None:
        r = running.get(job_id)
        if r is None or r.pause is not None:
            return
        starter.pause(attempt_of[job_id].label)
        now = time.time() - t0
        r.pause = Pause(reason, now, frozenset(beside))
        results[job_id].pauses += 1
        log.info("[%s] t=%6.2fs pause %s: %s", scheme.name, now, job_id, why)

    def resume(job_id: str) -> None:
        r = running.get(job_id)
        if r is None or r.pause is None:
            return
        starter.resume(attempt_of[job_id].label)
        now = time.time() - t0
        paused = now - r.pause.since
        results[job_id].paused_s += paused
        if job_id in working_since:  # paused time is no work done (nor lost by a kill)
            working_since[job_id] += paused
        r.pause, r.resumed_s = None, now
        log.info("[%s] t=%6.2fs resume %s", scheme.name, now, job_id)

    def preempt(job_id: str, reason: str) -> None:
        resume(job_id)  # a frozen process takes its SIGTERM only once it goes on
        r = running.pop(job_id, None)
        if r is None:
            return
        results[job_id].preemptions.append(reason)
        attempt = attempt_of.pop(job_id)
        label_job.pop(attempt.label, None)
        since = working_since.pop(job_id, None)
        if since is not None:  # its work so far is lost: it starts again from scratch
            results[job_id].discarded_s += max(0.0, time.time() - t0 - since)
        starter.stop(attempt.label)
        pending.append(r.job)
        pending.sort(key=lambda j: j.arrival_s)
        log.info("[%s] t=%6.2fs preempt %s: %s", scheme.name, time.time() - t0, job_id, reason)

    while arrivals or pending or running:
        now = time.time()
        refused = list(pending)  # tried by the last round and not started, as the filter's
        while arrivals and arrivals[0].arrival_s <= now - t0:
            pending.append(arrivals.pop(0))
        for job_id in scheme.resumptions(list(running.values())):
            resume(job_id)
        for job_id in scheme.promotions(list(running.values()), refused):
            if job_id in running and not running[job_id].promoted:
                running[job_id].promoted = True
                results[job_id].promoted_s = now - t0
                log.info("[%s] t=%6.2fs promote %s", scheme.name, now - t0, job_id)
        for launch in scheme.select(list(pending), list(running.values())):
            job = launch.job
            res = results[job.id]
            for victim in launch.evict:
                preempt(victim, f"{job.id} (guaranteed) needs the GPU memory it holds")
            for victim in launch.pause:
                why = f"{job.id} (guaranteed) needs the compute"
                pause(victim, REASON_GUARANTEED, why, (job.id,))
            pending.remove(job)
            seed = zlib.crc32(job.id.encode()) % 10_000
            launched = time.time() - t0
            try:
                attempt = starter.start(launch, iterations=res.iterations, seed=seed)
            except WorkerError as exc:
                res.error = f"start failed: {exc}"
                scheme.finished(job)
                continue
            if res.launched_s is None:
                res.launched_s = launched
            res.cold_starts += int(attempt.cold)
            res.thread_percent = launch.thread_percent
            res.priority = launch.priority
            res.opportunistic = launch.opportunistic
            res.opted_in = launch.opted_in
            res.note = "; ".join(x for x in (launch.note, attempt.note) if x) or None
            if attempt.note:  # a cold start nobody planned is worth a warning, a stand-in not
                level = logging.WARNING if attempt.cold else logging.INFO
                log.log(level, "[%s] %s: %s", scheme.name, job.id, attempt.note)
            label_job[attempt.label] = job
            attempt_of[job.id] = attempt
            running[job.id] = Running(job, launch, launched)
            log.info(
                "[%s] t=%6.2fs launch %s%s threads=%s prio=%s%s",
                scheme.name,
                launched,
                job.id,
                " (cold)" if attempt.cold else "",
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
                resume(jid)  # a frozen process would not take its SIGTERM
            for attempt in attempt_of.values():
                starter.stop(attempt.label)
            return
        wait = 0.25 if governing is None else min(0.25, governing.period_s)
        if arrivals:
            wait = max(0.0, min(wait, t0 + arrivals[0].arrival_s - time.time()))
        try:
            ev = starter.events.get(timeout=wait)
        except queue.Empty:
            continue
        job_for = label_job.get(ev.label)
        if job_for is None or job_for.id not in running:
            continue
        res = results[job_for.id]
        if ev.name == "started":
            res.start_s = float(ev.fields.get("t_ready", time.time())) - t0
            if res.first_start_s is None:
                res.first_start_s = res.start_s
            working_since[job_for.id] = res.start_s
            launched_at = running[job_for.id].start_s
            if attempt_of[job_for.id].cold and launched_at is not None:
                res.startup_in_clock_s += max(0.0, res.start_s - launched_at)
            log.info("[%s] t=%6.2fs start  %s", scheme.name, res.start_s, job_for.id)
            continue
        if ev.name == "done":
            res.end_s = ev.fields["t_end"] - t0
            if res.start_s is None:  # no "started" seen: its work began when it was told
                res.start_s = float(ev.fields.get("t_ready", ev.fields["t_end"])) - t0
                res.first_start_s = res.first_start_s or res.start_s
            res.latencies_ms = list(ev.fields.get("latencies_ms", []))
            peak = ev.fields.get("peak_mib")
            res.peak_mib = int(peak) if isinstance(peak, int | float) else None
            held = ev.fields.get("process_mib")
            res.process_mib = int(held) if isinstance(held, int | float) else None
        elif ev.name in ("error", "exit"):
            res.error = f"{ev.name}: {ev.fields} {starter.tail(ev.label)}"
            log.error("[%s] %s failed: %s", scheme.name, job_for.id, res.error)
        else:
            continue
        del running[job_for.id]
        attempt_of.pop(job_for.id, None)
        working_since.pop(job_for.id, None)
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
    on_solo: Callable[..., None],
) -> list[PackResult]:
    """Measure every pack of every stage until ``deadline`` (then the rest is skipped).

    ``on_solo(member, start, end, rate, report)`` is called after each single-job window at
    100% threads, while the GPU still holds only that job's recent history (for its profile);
    ``report`` is the worker's, its memory included.
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
                on_solo(pack[0], t_start, time.time(), rates[0], reports[0])
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
