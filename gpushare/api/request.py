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
    ANN_SHARE,
    CLASS_BATCH,
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
    return GpuRequest(
        percent=percent,
        memory_bytes=memory,
        gpu_class=parse_class(annotations.get(ANN_CLASS)),
        share=share.strip() if share is not None else None,
        limit_percent=limit,
    )
