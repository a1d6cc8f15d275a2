"""The GpuShare custom resource: typed spec and status, and the pod annotations it implies.

The OpenAPI schema in ``crds/gpushare.io_gpushares.yaml`` refuses most bad specs at the API
server; this module parses what got through (and what older servers let through) into typed
values, raising :class:`InvalidInputError` naming the ``spec.*`` path and the fix. It also
defines the pod annotations through which a GpuShare speaks to the scheduler extender, so the
webhook, the extender and the operator agree on them without importing each other.
"""

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpushare.api.bounds import load_json, object_field
from gpushare.api.errors import InvalidInputError
from gpushare.api.label_selector import LabelSelector, parse_label_selector
from gpushare.api.limit import check_limit, parse_limit
from gpushare.api.names import (
    ANN_CLASS,
    ANN_FRACTION,
    ANN_LIMIT,
    ANN_MEMORY,
    ANN_SHARE,
    CLASSES,
    GROUP,
    MPS_MAX_CLIENTS,
    SLICES_PER_GPU,
    VERSION,
)
from gpushare.api.profile import GpuProfile
from gpushare.api.quantities import format_memory, parse_fraction, parse_memory

KIND: Final = "GpuShare"
PLURAL: Final = "gpushares"
SINGULAR: Final = "gpushare"
CRD_NAME: Final = f"{PLURAL}.{GROUP}"
API_VERSION: Final = f"{GROUP}/{VERSION}"

PHASE_PENDING: Final = "Pending"
PHASE_PROFILING: Final = "Profiling"
PHASE_PACKED: Final = "Packed"
PHASE_FAILED: Final = "Failed"
PHASES: Final = (PHASE_PENDING, PHASE_PROFILING, PHASE_PACKED, PHASE_FAILED)

PROFILING_AUTO: Final = "auto"
"""Profile unless the cache holds a profile for the same image, command and GPU model."""
PROFILING_SKIP: Final = "skip"
"""Never profile; pack without a profile (the policy then treats the job as unknown)."""
PROFILING_ALWAYS: Final = "always"
"""Profile the first pod even when the cache has a profile."""
PROFILING_MODES: Final = (PROFILING_AUTO, PROFILING_SKIP, PROFILING_ALWAYS)
WINDOW_MIN_SECONDS: Final = 10
WINDOW_MAX_SECONDS: Final = 3600
WINDOW_DEFAULT_SECONDS: Final = 60

POLICY_CAUTIOUS: Final = "cautious"
"""Pack only where the interference model admits it; profile alone on an idle GPU."""
POLICY_AGGRESSIVE: Final = "aggressive"
"""Pack wherever the guaranteed shares fit; profile on a lightly loaded GPU."""
POLICY_EXCLUSIVE: Final = "exclusive"
"""Never share a GPU with pods of another GpuShare or with unmanaged fractional pods."""
POLICIES: Final = (POLICY_CAUTIOUS, POLICY_AGGRESSIVE, POLICY_EXCLUSIVE)

# Pod annotations a GpuShare adds to the pods it governs (read by the scheduler extender).
ANN_PACKING_POLICY: Final = f"{GROUP}/packing-policy"
"""cautious | aggressive | exclusive, inherited from spec.packing.policy."""
ANN_MAX_PODS_PER_GPU: Final = f"{GROUP}/max-pods-per-gpu"
"""Integer 1..48: the extender places this pod only on a GPU holding fewer gpushare pods."""
ANN_PROFILING: Final = f"{GROUP}/profiling"
"""On the pod elected to be profiled: ``true`` until its profile is stored, then ``done``.

While ``true`` the extender places the pod per its packing policy (cautious/exclusive: a GPU
with no tenants; aggressive: a lightly loaded GPU, see LIGHTLY_LOADED_PERCENT) and places no
other pod on that GPU, so the node agent's profiler measures this job alone."""
ANN_PROFILING_WINDOW: Final = f"{GROUP}/profiling-window"
"""Seconds the profiler samples the pod's GPU once the pod runs (informational for the extender)."""
ANN_PROFILE: Final = f"{GROUP}/profile"
"""Compact JSON of the share's stored profile (the ``status.profile`` object: gpuModel, fp16,
fp32, fp64, tensor, smOccupancy, dramBandwidth, ...), written on the share's unscheduled pods
once it is Packed, so the extender's interference check sees the job's measured profile."""
PROFILING_ACTIVE: Final = "true"
PROFILING_DONE: Final = "done"
LIGHTLY_LOADED_PERCENT: Final = 25
"""Aggressive profiling may use a GPU whose guaranteed shares sum to at most this."""

GPUSHARE_ANNOTATIONS: Final = (
    ANN_SHARE,
    ANN_FRACTION,
    ANN_MEMORY,
    ANN_CLASS,
    ANN_PACKING_POLICY,
    ANN_MAX_PODS_PER_GPU,
)

# The same regular expressions as the CRD's CEL rules, so both refuse the same specs.
FRACTION_PATTERN: Final = r"^([01]?[.][0-9]{1,2}0*|[01]|[0-9]{1,3}([.]0+)?%)$"
MEMORY_PATTERN: Final = r"^[0-9]+([.][0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
LIMIT_PATTERN: Final = r"^(0?[.][0-9]{1,2}|[01]([.]0{1,2})?|[0-9]{1,3}%)$"
FRACTION_AUTO: Final = "auto"
"""``spec.fraction: auto``: gpushare sizes the request from the job's stored profile
(``gpushare.packing.sizing``); pods created before the share has a profile ask for a whole
GPU (docs/operator.md, "fraction: auto")."""


FRACTION_REQUIRED_FIX: Final = (
    'write the share of one GPU each pod is guaranteed, a fraction like "0.25" or a percent '
    'like "25%", or "auto" to size it from the job\'s profile'
)
"""What a GpuShare without ``spec.fraction`` is told, here and by the CRD's first rule."""


@dataclass(frozen=True)
class ProfilingSpec:
    mode: str = PROFILING_AUTO
    window_seconds: int = WINDOW_DEFAULT_SECONDS


@dataclass(frozen=True)
class PackingSpec:
    policy: str = POLICY_CAUTIOUS
    max_pods_per_gpu: int | None = None
    """None: only the MPS client limit applies."""


@dataclass(frozen=True)
class GpuShareSpec:
    """A parsed, validated GpuShare spec."""

    fraction: str
    """As the user wrote it ("0.25", "25%" or "auto"), copied to governed pods unless auto."""
    percent: int
    """The fraction in GPU-percent slices (1..100); with ``auto`` the whole GPU, what the
    share stands for until it has a profile (``cluster.state.shares.sized_percent``)."""
    memory: str | None = None
    memory_bytes: int | None = None
    limit: str | None = None
    """As the user wrote it, copied to governed pods as ``gpushare.io/gpu-limit``."""
    gpu_class: str = "batch"
    selector: LabelSelector | None = None
    profiling: ProfilingSpec = ProfilingSpec()
    packing: PackingSpec = PackingSpec()
    opportunistic: bool | None = None
    """``spec.opportunistic``: the share's pods opt in to opportunistic placement (a pod's own
    ``gpushare.io/opportunistic`` wins); None leaves it to the cluster's default."""

    @property
    def auto(self) -> bool:
        """gpushare sizes the request from the job's profile (``fraction: auto``)."""
        return self.fraction == FRACTION_AUTO


def _fix(text: str) -> str:
    return f"{text} (kubectl explain gpushare.spec)"


def _int_in(raw: object, path: str, low: int, high: int) -> int:
    fix = f"write a whole number from {low} to {high}"
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise InvalidInputError(path, f"{raw!r} is not a whole number", fix)
    if not low <= raw <= high:
        raise InvalidInputError(path, f"{raw} is outside {low}..{high}", fix)
    return raw


def _limit(raw: object, percent: int) -> str | None:
    """``spec.limit`` as written (checked as the CRD's rules check it), or None."""
    if raw is None:
        return None
    fix = 'write a fraction like "0.5" or a percent like "50%" (at least spec.fraction, at most 1)'
    if not isinstance(raw, str):
        raise InvalidInputError("spec.limit", "must be a string", fix)
    if not re.fullmatch(LIMIT_PATTERN, raw):
        raise InvalidInputError(
            "spec.limit",
            f"{raw!r} is not a fraction with at most two decimals or a whole percent",
            fix,
        )
    check_limit(parse_limit(raw, field="spec.limit"), percent, field="spec.limit")
    return raw


def _fraction_percent(raw: object) -> int:
    """``spec.fraction`` in GPU-percent (``auto``: the whole GPU until the share is sized)."""
    if raw == FRACTION_AUTO:
        return SLICES_PER_GPU
    if raw is None:
        raise InvalidInputError("spec.fraction", "is required", FRACTION_REQUIRED_FIX)
    if not isinstance(raw, str):
        raise InvalidInputError(
            "spec.fraction",
            "is not a string",
            'write a quoted fraction like "0.25", or "auto" to size it from the profile',
        )
    if not re.fullmatch(FRACTION_PATTERN, raw):
        raise InvalidInputError(
            "spec.fraction",
            f"{raw!r} is not a fraction with at most two decimals or a whole percent",
            'write "0.25" or "25%", or "auto"',
        )
    number = float(raw.rstrip("%")) / (100 if raw.endswith("%") else 1)
    if number > 1:
        raise InvalidInputError(
            "spec.fraction",
            f"{raw!r} asks for more than one GPU",
            'a GpuShare shares one GPU: write a fraction from "0.01" to "1"',
        )
    return parse_fraction(raw, field="spec.fraction")


def parse_spec(spec: Mapping[str, Any]) -> GpuShareSpec:
    """Validate a GpuShare spec; raises InvalidInputError naming ``spec.<field>`` and the fix.
    Fields are checked in the order they are listed here, so a spec with several errors names
    the same one every time."""
    fraction_raw = spec.get("fraction")
    percent = _fraction_percent(fraction_raw)
    memory_raw, memory_bytes = _memory(spec.get("memory"))
    if fraction_raw == FRACTION_AUTO and spec.get("limit") is not None:
        raise InvalidInputError(
            "spec.limit",
            "cannot be set with fraction auto (gpushare sizes the request, pods stay uncapped)",
            'drop spec.limit, or write a fraction like "0.5" to set both yourself',
        )
    limit_raw = _limit(spec.get("limit"), percent)
    gpu_class = spec.get("class", "batch")
    if gpu_class not in CLASSES:
        raise InvalidInputError(
            "spec.class", f"unknown class {gpu_class!r}", f"use one of {', '.join(CLASSES)}"
        )
    selector = parse_label_selector(spec["selector"]) if spec.get("selector") is not None else None
    profiling = _profiling(spec.get("profiling"))
    pack = object_field(
        spec.get("packing"), field="spec.packing", fix=_fix("write {policy: cautious}")
    )
    policy = _policy(pack, gpu_class)
    skip = profiling.mode == PROFILING_SKIP
    if fraction_raw == FRACTION_AUTO and skip and gpu_class != "latency":
        raise InvalidInputError(
            "spec.profiling.mode",
            "skip leaves fraction auto without a profile to size from (every pod would ask "
            "for a whole GPU)",
            'use profiling mode auto or always, or write a fraction like "0.5"',
        )
    opportunistic = _opportunistic(spec.get("opportunistic"), gpu_class)
    max_pods_raw = pack.get("maxPodsPerGpu")
    max_pods = (
        None
        if max_pods_raw is None
        else _int_in(max_pods_raw, "spec.packing.maxPodsPerGpu", 1, MPS_MAX_CLIENTS)
    )
    return GpuShareSpec(
        fraction=str(fraction_raw),
        percent=percent,
        memory=memory_raw,
        memory_bytes=memory_bytes,
        limit=limit_raw,
        gpu_class=str(gpu_class),
        selector=selector,
        profiling=profiling,
        packing=PackingSpec(policy, max_pods),
        opportunistic=opportunistic,
    )


def _memory(raw: object) -> tuple[str | None, int | None]:
    """``spec.memory`` and its bytes (None, None when unset)."""
    if raw is None:
        return None, None
    if not isinstance(raw, str):
        raise InvalidInputError("spec.memory", "must be a string", 'write "10Gi"')
    if not re.fullmatch(MEMORY_PATTERN, raw):
        raise InvalidInputError(
            "spec.memory",
            f"{raw!r} is not a memory quantity",
            'write a quantity like "10Gi", "512Mi" or a byte count',
        )
    return raw, parse_memory(raw, field="spec.memory")


def _profiling(raw: object) -> ProfilingSpec:
    """``spec.profiling``: its mode and window."""
    prof = object_field(raw, field="spec.profiling", fix=_fix("write {mode: auto}"))
    mode = prof.get("mode", PROFILING_AUTO)
    if mode not in PROFILING_MODES:
        raise InvalidInputError(
            "spec.profiling.mode", f"unknown mode {mode!r}", f"use {', '.join(PROFILING_MODES)}"
        )
    window = _int_in(
        prof.get("windowSeconds", WINDOW_DEFAULT_SECONDS),
        "spec.profiling.windowSeconds",
        WINDOW_MIN_SECONDS,
        WINDOW_MAX_SECONDS,
    )
    return ProfilingSpec(str(mode), window)


def _policy(pack: Mapping[str, Any], gpu_class: object) -> str:
    """``spec.packing.policy``; aggressive packing is refused for a latency-class share."""
    policy = pack.get("policy", POLICY_CAUTIOUS)
    if policy not in POLICIES:
        raise InvalidInputError(
            "spec.packing.policy", f"unknown policy {policy!r}", f"use {', '.join(POLICIES)}"
        )
    if gpu_class == "latency" and policy == POLICY_AGGRESSIVE:
        raise InvalidInputError(
            "spec.packing.policy",
            "aggressive packing cannot protect a latency-class job",
            "use policy cautious or exclusive with class latency, or class batch",
        )
    return str(policy)


def _opportunistic(raw: object, gpu_class: object) -> bool | None:
    """``spec.opportunistic``: a boolean, never true for a latency-class share."""
    if raw is not None and not isinstance(raw, bool):
        raise InvalidInputError(
            "spec.opportunistic",
            f"must be true or false, not {type(raw).__name__}",
            _fix(
                "write opportunistic: true to let the share's pods run preemptible beyond a "
                "GPU's guaranteed capacity"
            ),
        )
    if raw and gpu_class == "latency":
        raise InvalidInputError(
            "spec.opportunistic",
            "is true for a latency-class share",
            "latency pods are protected and never preempted: drop spec.opportunistic, or use "
            "class batch",
        )
    return raw


def inherited_annotations(spec: GpuShareSpec, *, share_name: str) -> dict[str, str]:
    """The annotations a governed pod carries so the webhook and extender see the share's
    request. A pod's own request annotations win over these (see ``missing_annotations``)."""
    out = {
        ANN_SHARE: share_name,
        ANN_CLASS: spec.gpu_class,
        ANN_PACKING_POLICY: spec.packing.policy,
    }
    if not spec.auto:  # an auto share's pods carry the request the webhook sized
        out[ANN_FRACTION] = spec.fraction
    if spec.memory is not None:
        out[ANN_MEMORY] = spec.memory
    if spec.limit is not None:
        out[ANN_LIMIT] = spec.limit
    if spec.packing.max_pods_per_gpu is not None:
        out[ANN_MAX_PODS_PER_GPU] = str(spec.packing.max_pods_per_gpu)
    return out


def missing_annotations(
    spec: GpuShareSpec, *, share_name: str, annotations: Mapping[str, str]
) -> dict[str, str]:
    """The inherited annotations a pod lacks; empty when nothing needs writing (idempotence)."""
    wanted = inherited_annotations(spec, share_name=share_name)
    return {k: v for k, v in wanted.items() if k not in annotations}


def linked_share(annotations: Mapping[str, str]) -> str | None:
    """Name of the GpuShare (of the pod's namespace) that governs a pod, or None: the one its
    ``gpushare.io/share`` annotation names. A share's selector links a pod only when the pod is
    created (the webhook writes the annotation then), so a label added later moves nothing
    (docs/operator.md, "Which pods a share governs")."""
    return annotations.get(ANN_SHARE, "").strip() or None


def selector_matches(
    shares: Iterable[tuple[str, GpuShareSpec | None]], *, labels: Mapping[str, str]
) -> list[str]:
    """Names of the GpuShares whose ``spec.selector`` matches ``labels``, sorted."""
    return sorted(
        name
        for name, spec in shares
        if spec is not None and spec.selector is not None and spec.selector.matches(labels)
    )


@dataclass(frozen=True)
class PlacementEntry:
    """One governed pod's placement, as listed in ``status.placements``."""

    pod: str
    node: str
    gpu_uuid: str
    thread_percent: int
    memory_limit_bytes: int

    def to_status(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "node": self.node,
            "gpuUuid": self.gpu_uuid,
            "threadPercent": self.thread_percent,
            "memoryLimit": format_memory(self.memory_limit_bytes),
        }


def profile_annotation(status_profile: Mapping[str, Any]) -> str:
    """The ``gpushare.io/profile`` annotation value for a ``status.profile`` object."""
    return json.dumps(dict(status_profile), sort_keys=True, separators=(",", ":"))


def parse_profile_annotation(text: str) -> GpuProfile:
    """Read ``gpushare.io/profile``; raises InvalidInputError naming the annotation."""
    fix = "the operator writes it; remove the annotation and it is written again"
    raw = load_json(text, field=ANN_PROFILE, fix=fix)
    if not isinstance(raw, Mapping):
        raise InvalidInputError(ANN_PROFILE, "must be a JSON object", fix)
    return GpuProfile.from_status(raw, path=ANN_PROFILE)


def scheduling_hold(
    *, pod_name: str, pod_annotations: Mapping[str, str], share_status: Mapping[str, Any] | None
) -> str | None:
    """Why the extender must not place a governed pod yet, or None to place it now.

    A GpuShare that still needs a profile lets only its elected profiling pod through, so
    that pod runs alone for the profiling window; the others wait until the share is Packed.
    ``share_status`` is the GpuShare's ``status`` (None or {} before the operator saw it).
    """
    if pod_annotations.get(ANN_PROFILING) == PROFILING_ACTIVE:
        return None
    phase = (share_status or {}).get("phase")
    share = pod_annotations.get(ANN_SHARE, "?")
    if phase in (None, PHASE_PENDING):
        return f"GpuShare {share} is electing a pod to profile; this pod waits until it is Packed"
    if phase == PHASE_PROFILING and (share_status or {}).get("profilingPod") != pod_name:
        return f"GpuShare {share} is profiling; this pod waits until it is Packed"
    return None


def placements_status(entries: Sequence[PlacementEntry]) -> list[dict[str, Any]]:
    return [e.to_status() for e in sorted(entries, key=lambda e: e.pod)]
