"""A pod's GPU request as read from its user annotations."""

from collections.abc import Mapping
from dataclasses import dataclass

from gpushare.api.errors import InvalidInputError
from gpushare.api.limit import check_limit, parse_limit
from gpushare.api.names import (
    ANN_CLASS,
    ANN_FRACTION,
    ANN_LIMIT,
    ANN_MEMORY,
    ANN_OPPORTUNISTIC,
    ANN_SHARE,
    CLASS_BATCH,
    CLASS_LATENCY,
    CLASSES,
    SLICES_PER_GPU,
)
from gpushare.api.quantities import parse_fraction, parse_memory


@dataclass(frozen=True)
class GpuRequest:
    """What a pod asks for. ``percent`` > 100 means ``percent // 100`` whole GPUs."""

    percent: int
    """Compute share in GPU-percent slices (25 = a quarter GPU, 200 = two whole GPUs)."""
    memory_bytes: int | None
    """Memory cap asked for; None means a share of the GPU's memory proportional to percent."""
    gpu_class: str = CLASS_BATCH
    """``latency`` or ``batch``."""
    share: str | None = None
    """Name of the GpuShare in the pod's namespace that governs this pod, if any."""
    limit_percent: int | None = None
    """``gpushare.io/gpu-limit`` in GPU-percent (its MPS thread cap); None = the default
    (``gpushare.packing.threads``: uncapped for batch pods, see docs/packing.md)."""
    opportunistic: bool | None = None
    """``gpushare.io/opportunistic`` as the pod states it; None when it does not (its
    GpuShare's ``spec.opportunistic``, else the cluster's default, decides)."""
    sized: bool = False
    """gpushare chose the request (a GpuShare's ``fraction: auto``), not the user: the
    cluster's opportunistic default applies only to such pods (docs/packing.md, "The sharing
    contract")."""

    @property
    def whole_gpus(self) -> int:
        """Whole GPUs requested (0 for a fractional request)."""
        return self.percent // SLICES_PER_GPU if self.percent >= SLICES_PER_GPU else 0

    @property
    def fractional(self) -> bool:
        return self.percent < SLICES_PER_GPU


def parse_class(value: str | None, *, field: str = ANN_CLASS) -> str:
    if value is None or value.strip() == "":
        return CLASS_BATCH
    text = value.strip()
    if text not in CLASSES:
        raise InvalidInputError(
            field, f"unknown class {value!r}", f"use one of {', '.join(CLASSES)}"
        )
    return text


_OPT_IN_FIX = (
    f'write {ANN_OPPORTUNISTIC}: "true" (may run preemptible beyond a GPU\'s guaranteed '
    'capacity) or "false"'
)


def parse_opportunistic(value: str | None, *, field: str = ANN_OPPORTUNISTIC) -> bool | None:
    """The opt-in as written: "true" or "false" (any case); None when absent."""
    if value is None:
        return None
    text = value.strip().lower()
    if text not in ("true", "false"):
        shown = value if len(value) <= 24 else value[:20] + "..."
        raise InvalidInputError(field, f"{shown!r} is not true or false", _OPT_IN_FIX)
    return text == "true"


def check_opportunistic(opted_in: bool, *, percent: int, gpu_class: str, field: str) -> None:
    """Refuse an opt-in gpushare cannot honour: a latency pod (protected, never preempted) or a
    pod of several whole GPUs (each would need its own prediction and preemption)."""
    if not opted_in:
        return
    if gpu_class == CLASS_LATENCY:
        raise InvalidInputError(
            field,
            "is true for a latency-class pod",
            "latency pods are protected and never preempted: remove the opt-in, or use class batch",
        )
    if percent > SLICES_PER_GPU:
        raise InvalidInputError(
            field,
            f"is true for a pod of {percent // SLICES_PER_GPU} whole GPUs",
            "opportunistic placement is for pods of one GPU or less: remove the opt-in, or ask "
            "for at most one GPU",
        )


def parse_request(annotations: Mapping[str, str]) -> GpuRequest | None:
    """Parse a pod's gpushare annotations; None when the pod asks for no shared GPU.

    A pod linked to a GpuShare (``gpushare.io/share``) without its own fraction gets the
    share's fraction later; here it reads as a request of 0 percent (its limit is checked
    against the share's fraction once that is known).
    """
    fraction = annotations.get(ANN_FRACTION)
    share = annotations.get(ANN_SHARE)
    limit_text = annotations.get(ANN_LIMIT)
    if fraction is None and share is None:
        if limit_text is not None:
            raise InvalidInputError(
                ANN_LIMIT,
                f"is set without {ANN_FRACTION}",
                f"add {ANN_FRACTION} (the share the pod is guaranteed), or remove the limit",
            )
        return None
    if share is not None and not share.strip():
        raise InvalidInputError(ANN_SHARE, "is empty", "name a GpuShare in the pod's namespace")
    percent = parse_fraction(fraction, field=ANN_FRACTION) if fraction is not None else 0
    memory_text = annotations.get(ANN_MEMORY)
    memory = parse_memory(memory_text, field=ANN_MEMORY) if memory_text is not None else None
    if memory is not None and percent > SLICES_PER_GPU:
        raise InvalidInputError(
            ANN_MEMORY,
            "applies to fractional requests only",
            f"remove it, or ask for at most one GPU in {ANN_FRACTION}",
        )
    limit = parse_limit(limit_text) if limit_text is not None else None
    check_limit(limit, percent)
    gpu_class = parse_class(annotations.get(ANN_CLASS))
    opted_in = parse_opportunistic(annotations.get(ANN_OPPORTUNISTIC))
    check_opportunistic(
        bool(opted_in), percent=percent, gpu_class=gpu_class, field=ANN_OPPORTUNISTIC
    )
    return GpuRequest(
        percent=percent,
        memory_bytes=memory,
        gpu_class=gpu_class,
        share=share.strip() if share is not None else None,
        limit_percent=limit,
        opportunistic=opted_in,
    )
