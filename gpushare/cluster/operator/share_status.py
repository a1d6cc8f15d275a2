"""A GpuShare's status as the operator writes it (pure): the JSON patch of one phase
transition, the fields and words that go with a stored profile, and the clock.

The reconciler (``operator.reconcile``) decides nothing here; it sends what these build. Each
transition ``test``s the phase it starts from, so two racing ticks change nothing twice
(docs/operator.md, "Life cycle").
"""

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from gpushare.api.gpushare_crd import LIGHTLY_LOADED_PERCENT, POLICY_AGGRESSIVE
from gpushare.api.names import SLICES_PER_GPU
from gpushare.api.profile import WORK_PIPES, GpuProfile
from gpushare.api.quantities import format_memory
from gpushare.cluster.operator.profiling import with_condition
from gpushare.cluster.state.share_rules import GRANT_LABEL
from gpushare.cluster.state.shares import ShareSummary, sized_percent
from gpushare.packing.model import NodeState
from gpushare.packing.opportunistic_memory import PEAK_HEADROOM
from gpushare.packing.sizing import as_fraction

COND_ACCEPTED = "Accepted"
COND_PROFILED = "Profiled"


def utcnow() -> datetime:
    return datetime.now(UTC)


def describe(profile: GpuProfile) -> str:
    parts = [
        f"{name} {value:.0%}"
        for name, value in (
            *((pipe, profile.ratio(pipe)) for pipe in WORK_PIPES),
            ("SM occupancy", profile.sm_occupancy),
            ("SM busy", profile.sm_utilization),
            ("DRAM", profile.dram_bandwidth),
            ("kernel time", profile.utilization),
        )
        if value is not None
    ]
    sim = " (simulated GPU)" if profile.simulated else ""
    return f"{', '.join(parts)} on {profile.gpu_model}{sim} over {profile.sampled_seconds:g} s"


def profiling_place(*, policy: str, granted: bool, marked: bool, node: str | None) -> str:
    """Where the elected pod is profiled, as far as it is known at the election: what the
    ``ProfilingStarted`` event promises, and no more (gpushare.cluster.state.share_rules)."""
    if not marked:
        return f"where it already runs (on {node}; neighbours may skew the profile)"
    if not granted:
        return (
            f"on a GPU it may share with others (policy {policy}): its namespace lacks the "
            f"admin's label {GRANT_LABEL}, so it cannot keep other pods off its GPU and "
            "neighbours may skew the profile"
        )
    if policy == POLICY_AGGRESSIVE:
        return (
            f"on a lightly loaded GPU (at most {LIGHTLY_LOADED_PERCENT}% allocated, policy "
            "aggressive; neighbours may skew the profile)"
        )
    return f"alone on a GPU (policy {policy})"


def sized_fields(share: ShareSummary, profile: GpuProfile) -> dict[str, Any]:
    """Status fields besides ``profile`` when a profile is stored: for ``fraction: auto`` the
    request it sizes (``status.request``), which pods created from then on ask for."""
    if share.spec is None or not share.spec.auto:
        return {}
    percent = sized_percent(share.spec, {"profile": profile.to_status()})
    return {"request": as_fraction(percent)}


def sized_note(
    fields: Mapping[str, Any],
    share: ShareSummary,
    profile: GpuProfile,
    nodes: Mapping[str, NodeState],
) -> str:
    """The event's words for :func:`sized_fields`, with :func:`memory_note` against the
    smallest healthy GPU of ``nodes``."""
    if "request" not in fields:
        return ""
    smallest = min((g.memory_bytes for n in nodes.values() for g in n.gpus if g.healthy), default=0)
    return (
        f"; fraction auto: pods created from now on ask for {fields['request']} of a GPU"
        f"{memory_note(share, profile, smallest_gpu_bytes=smallest)}"
    )


def memory_note(share: ShareSummary, profile: GpuProfile, *, smallest_gpu_bytes: int) -> str:
    """The event's warning when ``fraction: auto`` sized a share whose part of the cluster's
    smallest GPU's memory (``smallest_gpu_bytes``; 0: none known) is less than its profile's
    peak with :data:`~gpushare.packing.opportunistic_memory.PEAK_HEADROOM`: only the compute
    share is sized, and a pod's MPS memory limit is its share's part of its GPU's memory, so
    its pods may run out; it names ``spec.memory`` and a size (docs/operator.md,
    "fraction: auto")."""
    spec, peak = share.spec, profile.peak_memory_bytes
    if spec is None or not spec.auto or spec.memory_bytes is not None or not peak:
        return ""
    percent = sized_percent(spec, {"profile": profile.to_status()})
    if percent >= SLICES_PER_GPU or smallest_gpu_bytes <= 0:
        return ""
    part = smallest_gpu_bytes * percent // SLICES_PER_GPU
    need = math.ceil(peak * PEAK_HEADROOM / 2**30) * 2**30
    if need <= part:
        return ""
    return (
        f"; its peak memory alone, {_gib(peak)}, is more than its share gives on the cluster's "
        f"smallest GPU ({_gib(part)} of {_gib(smallest_gpu_bytes)}): set spec.memory to at "
        f"least {format_memory(need)}, or its pods may run out of GPU memory"
    )


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.1f} GiB"


def no_profiling_pod(*, attempts: int) -> dict[str, Any]:
    """Status fields of a share back in Pending: no profiling pod elected, started or running."""
    return {
        "profilingPod": None,
        "profilingStarted": None,
        "profilingElected": None,
        "profilingAttempts": attempts,
    }


Condition = tuple[str, bool, str, str]
"""A condition to set with a transition: (type, status, reason, message)."""


def transition_ops(
    share: ShareSummary,
    *,
    to_phase: str,
    fields: Mapping[str, Any] | None = None,
    condition: Condition | None = None,
    tests: Mapping[str, Any] | None = None,
    now: datetime,
) -> list[dict[str, Any]]:
    """The JSON patch moving ``share`` from its current phase to ``to_phase`` with ``fields``
    and ``condition``; it applies only while the phase (and each of ``tests``) is still what
    this share says, so nobody else's transition is overwritten."""
    status = share.status
    generation = (share.body.get("metadata") or {}).get("generation")
    values: dict[str, Any] = {"phase": to_phase, **(fields or {})}
    if isinstance(generation, int):
        values["observedGeneration"] = generation
    if condition is not None:
        type_, ok, reason, message = condition
        values["conditions"] = with_condition(
            status.get("conditions"),
            type_=type_,
            status=ok,
            reason=reason,
            message=message,
            now=now,
            generation=generation if isinstance(generation, int) else None,
        )
    if not isinstance(share.body.get("status"), Mapping):
        # No status yet: "test /status is null" holds only while it is absent.
        return [
            {"op": "test", "path": "/status", "value": None},
            {"op": "add", "path": "/status", "value": values},
        ]
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/status/phase", "value": status.get("phase")}
    ]
    ops.extend({"op": "test", "path": f"/status/{k}", "value": v} for k, v in (tests or {}).items())
    ops.extend({"op": "add", "path": f"/status/{k}", "value": v} for k, v in values.items())
    return ops
