"""Create pods in arrival order, watch them get bound or refused, stop at checkpoints.

A pod is *settled* once the scheduler decided on it: bound, or marked ``Unschedulable``. At most
``window`` pods are created and not yet settled at any time, so the scheduler takes them in
arrival order, as the simulator does, and its queue never runs far ahead of the pods the
controller has seen. A pod still unbound ``fail_after_s`` seconds after it was first marked
``Unschedulable`` (or ``max_wait_s`` after it was created) counts as failed and is deleted, as
the experiment drops a pod it cannot place (left pending, it would be retried on every later
event). At each checkpoint creation pauses until every pod created so far is bound or failed,
and ``on_checkpoint`` reads the allocation back from the API server.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.replay.manifests import REPLAY_LABEL
from bench.scale.kube import Api, ApiError, Json, follow

log = logging.getLogger("bench.replay")


@dataclass
class ReplayTiming:
    """What the watch and the creators saw, in seconds since the first POST."""

    total: int
    created: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    refused: dict[str, float] = field(default_factory=dict)
    """First time the scheduler marked the pod Unschedulable."""
    failed: dict[str, float] = field(default_factory=dict)
    checkpoints: dict[str, float] = field(default_factory=dict)
    """Checkpoint label -> when creation reached it (before draining)."""
    create_errors: list[str] = field(default_factory=list)
    timed_out: bool = False
    order: list[str] = field(default_factory=list)
    """Pod names in arrival order."""

    def settled(self, name: str) -> bool:
        return name in self.bound or name in self.refused or name in self.failed

    def resolved(self, name: str) -> bool:
        return name in self.bound or name in self.failed

    def rate(self, names: Sequence[str]) -> float | None:
        """Pods of ``names`` bound per second, from the first POST to the last of their binds."""
        times = [self.bound[n] for n in names if n in self.bound]
        if not times or max(times) <= 0:
            return None
        return round(len(times) / max(times), 2)


def _unschedulable(pod: Json) -> bool:
    for c in pod.get("status", {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return c.get("reason") == "Unschedulable"
    return False


async def _watch(
    api: Api, *, path: str, selector: str, rv: str, t: ReplayTiming, t0: float
) -> None:
    def seen(obj: Json) -> None:
        name = obj["metadata"]["name"]
        now = time.monotonic() - t0
        if obj.get("spec", {}).get("nodeName"):
            if name not in t.bound and name not in t.failed:
                t.bound[name] = now
        elif _unschedulable(obj) and name not in t.refused:
            t.refused[name] = now

    await follow(api, path, selector=selector, resource_version=rv, on_object=seen)


async def replay(
    api: Api,
    *,
    namespace: str,
    run: str,
    manifests: Sequence[Json],
    checkpoints: dict[int, str],
    on_checkpoint: Callable[[str], Awaitable[None]],
    window: int,
    concurrency: int,
    fail_after_s: float,
    max_wait_s: float,
    timeout_s: float,
    progress_s: float = 15.0,
) -> ReplayTiming:
    """Create ``manifests`` in order; ``checkpoints`` maps a count of pods created to the label
    of the checkpoint taken once that many are created and resolved."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    selector = f"{REPLAY_LABEL}={run}"
    listed = await api.request("GET", path, params={"labelSelector": selector, "limit": "1"})
    timing = ReplayTiming(total=len(manifests))
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    watcher = asyncio.create_task(
        _watch(
            api,
            path=path,
            selector=selector,
            rv=listed["metadata"]["resourceVersion"],
            t=timing,
            t0=t0,
        )
    )
    names = [m["metadata"]["name"] for m in manifests]
    timing.order = names
    next_index = 0
    settled_lo = resolved_lo = 0  # every pod before these positions is settled / resolved
    in_flight: set[asyncio.Task[None]] = set()
    last_progress = time.monotonic()

    async def create(manifest: Json) -> None:
        name = manifest["metadata"]["name"]
        try:
            await api.create(path, manifest)
            timing.created[name] = time.monotonic() - t0
        except Exception as exc:
            timing.create_errors.append(f"{name}: {exc}")
            timing.failed[name] = time.monotonic() - t0

    async def fail_overdue() -> None:
        now = time.monotonic() - t0
        for name in names[resolved_lo:next_index]:
            if timing.resolved(name) or name not in timing.created:
                continue
            refused = timing.refused.get(name)
            if (refused is not None and now - refused >= fail_after_s) or (
                now - timing.created[name] >= max_wait_s
            ):
                timing.failed[name] = now
                with contextlib.suppress(ApiError):
                    await api.request(
                        "DELETE",
                        f"{path}/{name}",
                        params={"gracePeriodSeconds": "0"},
                        ok_statuses=(404,),
                    )

    def report(stage: str) -> None:
        log.info(
            "%s: %d/%d created, %d bound, %d failed, %d waiting (%.0fs)",
            stage,
            len(timing.created),
            timing.total,
            len(timing.bound),
            len(timing.failed),
            sum(1 for n in names[resolved_lo:next_index] if not timing.resolved(n)),
            time.monotonic() - t0,
        )

    pending = dict(sorted(checkpoints.items()))
    try:
        while pending:
            if time.monotonic() > deadline:
                timing.timed_out = True
                break
            while settled_lo < next_index and timing.settled(names[settled_lo]):
                settled_lo += 1
            while resolved_lo < next_index and timing.resolved(names[resolved_lo]):
                resolved_lo += 1
            stop_at = min(*pending, len(manifests))
            unsettled = sum(1 for n in names[settled_lo:next_index] if not timing.settled(n))
            while (
                next_index < stop_at
                and len(in_flight) < concurrency
                and unsettled + len(in_flight) < window
            ):
                task = asyncio.create_task(create(manifests[next_index]))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                next_index += 1
            await asyncio.sleep(0.05)
            await fail_overdue()
            if time.monotonic() - last_progress >= progress_s:
                report("replay")
                last_progress = time.monotonic()
            if next_index >= stop_at and not in_flight:
                label = pending[min(pending)]
                timing.checkpoints.setdefault(label, time.monotonic() - t0)
                if resolved_lo >= next_index:
                    report(f"checkpoint {label}")
                    await on_checkpoint(label)
                    del pending[min(pending)]
    finally:
        for task in in_flight:
            task.cancel()
        watcher.cancel()
        await asyncio.gather(watcher, *in_flight, return_exceptions=True)
    return timing


def timing_summary(timing: ReplayTiming, *, first: int | None = None) -> dict[str, Any]:
    """Counts and rates; ``first``: also the rate of the first pods (up to a checkpoint)."""
    names = timing.order or list(timing.created)
    out: dict[str, Any] = {
        "pods": timing.total,
        "created": len(timing.created),
        "bound": len(timing.bound),
        "failed": len(timing.failed),
        "create_errors": len(timing.create_errors),
        "create_error_examples": timing.create_errors[:5],
        "timed_out": timing.timed_out,
        "pods_per_s": timing.rate(names),
    }
    if first is not None:
        out["pods_per_s_to_checkpoint"] = timing.rate(names[:first])
    return out
