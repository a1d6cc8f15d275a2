"""One measured phase: create pods as fast as the API server takes them, watch them get bound.

Times are taken in this process: creation = when the API server answered the POST, bound = when
the watch first shows ``spec.nodeName``. End-to-end rate = pods bound / (last bound - first
POST sent).
"""

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.scale.kube import Api, Json, follow
from bench.scale.workload import BENCH_LABEL


@dataclass
class PhaseTiming:
    """What the watch and the creators saw, in seconds since the first POST was sent."""

    total: int
    created: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    running: dict[str, float] = field(default_factory=dict)
    create_errors: list[str] = field(default_factory=list)
    stalled: bool = False
    released: float | None = None
    """Backlog mode: when the paused scheduler was let go, all pods created by then."""

    def summary(self) -> dict[str, Any]:
        bound_times = sorted(self.bound.values())
        created_times = sorted(self.created.values())
        latencies = sorted(self.bound[n] - self.created[n] for n in self.bound if n in self.created)
        to_running = sorted(
            self.running[n] - self.bound[n] for n in self.running if n in self.bound
        )
        last_bound = bound_times[-1] if bound_times else math.nan
        last_created = created_times[-1] if created_times else math.nan
        drain: dict[str, Any] = {}
        if self.released is not None and bound_times:
            span = last_bound - self.released
            drain = {
                "released_s": _round(self.released),
                "drain_s": _round(span),
                "drain_pods_per_s": _round(len(bound_times) / span if span > 0 else math.nan),
            }
        return {
            **drain,
            "pods": self.total,
            "created": len(self.created),
            "bound": len(self.bound),
            "running": len(self.running),
            "create_errors": len(self.create_errors),
            "create_error_examples": self.create_errors[:5],
            "stalled": self.stalled,
            "duration_s": _round(last_bound),
            "creation_s": _round(last_created),
            "pods_per_s": _round(len(bound_times) / last_bound if bound_times else 0.0),
            "creation_pods_per_s": _round(
                len(created_times) / last_created if created_times else 0.0
            ),
            "steady_pods_per_s": _round(steady_rate(bound_times)),
            "bind_latency_ms": {
                "p50": _round(_quantile(latencies, 0.5) * 1000),
                "p90": _round(_quantile(latencies, 0.9) * 1000),
                "p99": _round(_quantile(latencies, 0.99) * 1000),
                "max": _round(latencies[-1] * 1000 if latencies else math.nan),
            },
            "bound_to_running_ms": {
                "p50": _round(_quantile(to_running, 0.5) * 1000),
                "p99": _round(_quantile(to_running, 0.99) * 1000),
            },
        }


def _round(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 3)


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[index]


def steady_rate(sorted_times: Sequence[float]) -> float:
    """Pods per second between the 10th and 90th percentile bind: the rate once the pipeline
    is full, without start-up and tail."""
    n = len(sorted_times)
    if n < 20:
        return math.nan
    first, last = n // 10, (9 * n) // 10 - 1
    span = sorted_times[last] - sorted_times[first]
    return (last - first) / span if span > 0 else math.nan


async def _watch(
    api: Api,
    *,
    path: str,
    selector: str,
    rv: str,
    timing: PhaseTiming,
    t0: float,
    done: asyncio.Event,
) -> None:
    def seen(obj: Json) -> None:
        name = obj["metadata"]["name"]
        now = time.monotonic() - t0
        if obj.get("spec", {}).get("nodeName") and name not in timing.bound:
            timing.bound[name] = now
            if len(timing.bound) >= timing.total:
                done.set()
        if obj.get("status", {}).get("phase") == "Running" and name not in timing.running:
            timing.running[name] = now

    await follow(api, path, selector=selector, resource_version=rv, on_object=seen)


async def run_phase(
    api: Api,
    *,
    namespace: str,
    phase: str,
    manifests: Sequence[Json],
    concurrency: int,
    stall_timeout_s: float,
    timeout_s: float,
    pause: Callable[[], None] | None = None,
    resume: Callable[[], None] | None = None,
) -> PhaseTiming:
    """Create ``manifests`` with ``concurrency`` parallel POSTs and wait until all are bound,
    no pod got bound for ``stall_timeout_s``, or ``timeout_s`` passed.

    Backlog mode (``pause``/``resume`` given): the scheduler is paused while every pod is
    created and let go at once, so its drain rate is not bounded by how fast pods arrive."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    selector = f"{BENCH_LABEL}={phase}"
    listed = await api.request("GET", path, params={"labelSelector": selector, "limit": "1"})
    rv = listed["metadata"]["resourceVersion"]
    timing = PhaseTiming(total=len(manifests))
    done = asyncio.Event()
    t0 = time.monotonic()
    watcher = asyncio.create_task(
        _watch(api, path=path, selector=selector, rv=rv, timing=timing, t0=t0, done=done)
    )
    queue: asyncio.Queue[Json] = asyncio.Queue()
    for m in manifests:
        queue.put_nowait(m)

    async def creator() -> None:
        while True:
            try:
                manifest = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            name = manifest["metadata"]["name"]
            try:
                await api.create(path, manifest)
                timing.created[name] = time.monotonic() - t0
            except Exception as exc:
                timing.create_errors.append(f"{name}: {exc}")

    if pause is not None:
        pause()
    creators = [asyncio.create_task(creator()) for _ in range(concurrency)]
    if resume is not None:
        try:
            await asyncio.gather(*creators)
        finally:
            resume()
        timing.released = time.monotonic() - t0
    deadline = t0 + timeout_s
    last_progress, last_count = time.monotonic(), 0
    try:
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), timeout=1.0)
            now = time.monotonic()
            if len(timing.bound) != last_count:
                last_progress, last_count = now, len(timing.bound)
            creating = any(not c.done() for c in creators)
            if not creating and len(timing.bound) >= len(timing.created):
                break  # every pod that could be created is bound
            if not creating and now - last_progress > stall_timeout_s:
                timing.stalled = True
                break
            if now > deadline:
                timing.stalled = True
                break
        await asyncio.gather(*creators)
        # Give kwok a moment to mark the last pods Running (reported, not waited on).
        await asyncio.sleep(1.0)
    finally:
        for c in creators:
            c.cancel()
        watcher.cancel()
        await asyncio.gather(watcher, *creators, return_exceptions=True)
    return timing
