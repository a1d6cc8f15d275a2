"""What a trace run produced: per-job times and the scheme-level numbers reported."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.gpu.stats import mean, percentile


@dataclass
class JobResult:
    """One job of one trace under one scheme. Times are seconds from the trace's start."""

    id: str
    kind: str
    gpu_class: str
    arrival_s: float
    iterations: int
    start_s: float | None = None
    end_s: float | None = None
    init_s: float | None = None
    """Process start-up before the trace's clock: CUDA context, model, two warm-up steps."""
    thread_percent: int | None = None
    priority: int | None = None
    error: str | None = None
    note: str | None = None
    peak_mib: int | None = None
    """GPU memory the job's process held at its peak (PyTorch's caching allocator, without the
    CUDA context): what a ``gpushare.io/gpu-memory`` for it must cover."""
    process_mib: int | None = None
    """GPU memory NVML listed for the job's process at its end, CUDA context included; under
    exclusive FIFO the job ran alone, so this is what gpushare's profiler would have stored as
    its peak (``decide.ProductDecider.peaks``)."""
    latencies_ms: list[float] = field(default_factory=list)
    first_start_s: float | None = None
    """When it first started (a preempted job starts again from the beginning)."""
    opportunistic: bool = False
    """gpushare started it beyond the GPU's guaranteed capacity (its last start)."""
    opted_in: bool = False
    """It opted in (``schemes.Launch.opted_in``): its class bound does not hold beside other
    opted-in jobs, wherever it was placed."""
    promoted_s: float | None = None
    """When gpushare promoted it to guaranteed."""
    preemptions: list[str] = field(default_factory=list)
    """Why it was preempted, each time (it then waited and started again from scratch)."""
    launched_s: float | None = None
    """When its scheme first launched it: its process started then (cold) or was told to
    work (warm); ``start_s`` is when its work began."""
    cold_starts: int = 0
    """Starts with CUDA, the model and the warm-up steps inside the clock: planned for every
    scheme (``warmup.plan``), a setting no warm process had, or a restart after a kill."""
    startup_in_clock_s: float = 0.0
    """Seconds from its cold launches to their work's start, summed."""
    discarded_s: float = 0.0
    """Seconds of work thrown away: for each time its process was killed (preempted and
    started again from scratch), the time that attempt had been working."""
    pauses: int = 0
    """Times its process was paused (frozen) in place of a kill."""
    paused_s: float = 0.0
    """Seconds it spent paused, summed."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.end_s is not None

    @property
    def jct_s(self) -> float:
        assert self.end_s is not None
        return self.end_s - self.arrival_s

    @property
    def run_s(self) -> float:
        """First start to end of the counted work (start-up was paid before the clock; a
        preempted job's lost work and restart count in it)."""
        start = self.first_start_s if self.first_start_s is not None else self.start_s
        assert self.end_s is not None and start is not None
        return self.end_s - start

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            k: (round(v, 4) if isinstance(v, float) else v)
            for k, v in self.__dict__.items()
            if k != "latencies_ms"
        }
        if self.latencies_ms:
            out["requests"] = len(self.latencies_ms)
            out["p50_ms"] = round(percentile(self.latencies_ms, 50), 3)
            out["p99_ms"] = round(percentile(self.latencies_ms, 99), 3)
        return out


def summarize(jobs: Sequence[JobResult], *, solo_run_s: dict[str, float]) -> dict[str, Any]:
    """Makespan, mean JCT and throughput of one scheme on one trace; its cold starts, pauses,
    paused seconds and the seconds of work its kills threw away (``discarded_gpu_s``).

    throughput: solo-seconds of work finished per second of makespan (each job's solo run
    time is its run time under exclusive FIFO), so 1.0 means "as if one job at a time ran
    back to back at full speed with no gaps".
    """
    done = [j for j in jobs if j.ok]
    failed = [j.id for j in jobs if not j.ok]
    starts = {
        "cold_starts": sum(j.cold_starts for j in jobs),
        "startup_in_clock_s": round(sum(j.startup_in_clock_s for j in jobs), 3),
        "pauses": sum(j.pauses for j in jobs),
        "paused_s": round(sum(j.paused_s for j in jobs), 3),
        "discarded_gpu_s": round(sum(j.discarded_s for j in jobs), 3),
    }
    if not done:
        return {"makespan_s": None, "mean_jct_s": None, "throughput": None, "failed": failed,
                **starts}  # fmt: skip
    start = min(j.arrival_s for j in jobs)
    makespan = max(j.end_s for j in done if j.end_s is not None) - start
    work = sum(solo_run_s.get(j.id, 0.0) for j in done)
    slowdowns = {j.id: j.run_s / solo_run_s[j.id] for j in done if solo_run_s.get(j.id)}
    out: dict[str, Any] = {
        "makespan_s": round(makespan, 3),
        "mean_jct_s": round(mean([j.jct_s for j in done]), 3),
        "throughput": round(work / makespan, 4) if makespan > 0 and work else None,
        "max_slowdown": round(max(slowdowns.values()), 3) if slowdowns else None,
        "slowest_job": max(slowdowns, key=lambda k: slowdowns[k]) if slowdowns else None,
        "failed": failed,
        "preemptions": sum(len(j.preemptions) for j in jobs),
        "promotions": sum(1 for j in jobs if j.promoted_s is not None),
        "opportunistic_starts": sum(1 for j in jobs if j.opportunistic),
        **starts,
    }
    lat = [x for j in done for x in j.latencies_ms]
    if lat:
        out["inference_p50_ms"] = round(percentile(lat, 50), 3)
        out["inference_p99_ms"] = round(percentile(lat, 99), 3)
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)
