"""Executes schemes and colocation stages on the GPU with worker processes."""

import logging
import queue
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.gpu.colocate import Member, PackResult, Stage
from bench.gpu.metrics import JobResult
from bench.gpu.mps import client_env
from bench.gpu.procs import Worker, Workers, close_together
from bench.gpu.schemes import Launch, Running, Scheme, same_settings
from bench.gpu.traces import TraceJob

log = logging.getLogger("bench.gpu")

SPAWN_TIMEOUT_S = 240.0
INIT_TIMEOUT_S = 180.0


def run_trace(
    *,
    scheme: Scheme,
    jobs: Sequence[TraceJob],
    iterations: dict[str, int],
    workers: Workers,
    pipe_dir: Path | None,
    timeout_s: float,
) -> list[JobResult]:
    """Run one trace under one scheme; every job is its own process, started and warmed up
    (CUDA context, model, two iterations) with its MPS settings before the clock starts."""
    if scheme.mps and pipe_dir is None:
        raise ValueError(f"scheme {scheme.name} needs the MPS daemon's pipe directory")
    by_label = {f"{scheme.name}.{j.id}": j for j in jobs}
    label_of = {j.id: label for label, j in by_label.items()}
    results = {
        j.id: JobResult(j.id, j.kind, j.gpu_class, j.arrival_s, iterations[j.id]) for j in jobs
    }
    try:
        started = workers.start_many(list(by_label), timeout_s=SPAWN_TIMEOUT_S)
        procs = dict(zip(by_label, started, strict=True))
        prepared = {j.id: scheme.prepare(j) for j in jobs}
        for j in jobs:
            p = prepared[j.id]
            env = client_env(
                pipe_dir=pipe_dir if scheme.mps else None,
                thread_percent=p.thread_percent,
                priority=p.priority,
                memory_limit_mib=p.memory_limit_mib,
            )
            procs[label_of[j.id]].send({"cmd": "init", "kind": j.kind, "env": env})
        for j in jobs:
            ready = workers.expect(procs[label_of[j.id]], "ready", timeout_s=INIT_TIMEOUT_S)
            results[j.id].init_s = float(ready["init_s"])
        _drive(
            scheme=scheme,
            jobs=jobs,
            results=results,
            procs=procs,
            label_of=label_of,
            prepared=prepared,
            workers=workers,
            timeout_s=timeout_s,
        )
    finally:
        workers.close_all()
    return [results[j.id] for j in jobs]


def _drive(
    *,
    scheme: Scheme,
    jobs: Sequence[TraceJob],
    results: dict[str, JobResult],
    procs: dict[str, Worker],
    label_of: dict[str, str],
    prepared: dict[str, Launch],
    workers: Workers,
    timeout_s: float,
) -> None:
    """The trace's clock: arrivals, the scheme's launches, completions."""
    by_label = {label: j for j in jobs for label in (label_of[j.id],)}
    arrivals = sorted(jobs, key=lambda j: j.arrival_s)
    pending: list[TraceJob] = []
    running: dict[str, Running] = {}
    t0 = time.time() + 0.2
    deadline = t0 + timeout_s
    while arrivals or pending or running:
        now = time.time()
        while arrivals and arrivals[0].arrival_s <= now - t0:
            pending.append(arrivals.pop(0))
        for launch in scheme.select(list(pending), list(running.values())):
            job = launch.job
            res = results[job.id]
            res.start_s = time.time() - t0
            res.thread_percent = launch.thread_percent
            res.priority = launch.priority
            if not same_settings(launch, prepared[job.id]):
                res.note = (
                    f"policy chose threads={launch.thread_percent} prio={launch.priority} "
                    f"mem={launch.memory_limit_mib} at start, but the process was warmed up "
                    f"with {prepared[job.id]}"
                )
                log.warning("[%s] %s: %s", scheme.name, job.id, res.note)
            seed = zlib.crc32(job.id.encode()) % 10_000
            procs[label_of[job.id]].send({"cmd": "run", "iterations": res.iterations, "seed": seed})
            pending.remove(job)
            running[job.id] = Running(job, launch, res.start_s)
            log.info(
                "[%s] t=%6.2fs start %s threads=%s prio=%s%s",
                scheme.name,
                res.start_s,
                job.id,
                launch.thread_percent,
                launch.priority,
                f" ({launch.note})" if launch.note else "",
            )
        if time.time() > deadline:
            for jid in list(running) + [j.id for j in pending + arrivals]:
                results[jid].error = f"not finished within {timeout_s:.0f}s"
            return
        wait = 0.25
        if arrivals:
            wait = max(0.0, min(wait, t0 + arrivals[0].arrival_s - time.time()))
        try:
            ev = workers.all_events.get(timeout=wait)
        except queue.Empty:
            continue
        job_for = by_label.get(ev.label)
        if job_for is None or job_for.id not in running:
            continue
        res = results[job_for.id]
        if ev.name == "done":
            res.end_s = ev.fields["t_end"] - t0
            res.latencies_ms = list(ev.fields.get("latencies_ms", []))
        elif ev.name in ("error", "exit"):
            res.error = f"{ev.name}: {ev.fields} {procs[ev.label].tail(3)}"
            log.error("[%s] %s failed: %s", scheme.name, job_for.id, res.error)
        else:
            continue
        del running[job_for.id]
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

    def ensure(self, members: set[Member], *, priority: Callable[[Member], int | None]) -> None:
        """Close workers not in ``members``, start and initialise the missing ones."""
        gone = [m for m in self.live if m not in members]
        close_together([self.live.pop(m) for m in gone])
        for m in gone:
            self.workers.workers.pop(m.label, None)
        missing = sorted(members - set(self.live), key=lambda m: m.label)
        if not missing:
            return
        started = self.workers.start_many([m.label for m in missing], timeout_s=SPAWN_TIMEOUT_S)
        for m, w in zip(missing, started, strict=True):
            env = client_env(
                pipe_dir=self.pipe_dir,
                thread_percent=m.thread_percent if m.thread_percent < 100 else None,
                priority=priority(m),
            )
            w.send({"cmd": "init", "kind": m.kind, "env": env})
        for m, w in zip(missing, started, strict=True):
            self.workers.expect(w, "ready", timeout_s=INIT_TIMEOUT_S)
            self.live[m] = w

    def window(
        self, members: Sequence[Member], *, seconds: float, seed: int = 0
    ) -> list[dict[str, Any]]:
        """Run ``members`` together for ``seconds``; each reports its own rate."""
        start = time.time() + 0.15
        for m in members:
            self.live[m].send(
                {"cmd": "window", "start": start, "end": start + seconds, "seed": seed}
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
        pool.ensure(stage.members, priority=lambda m: None)
        for i, pack in enumerate(stage.packs):
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
