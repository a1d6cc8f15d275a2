"""The profiler endpoint: windowed averages of one GPU's counters, for the operator.

The operator builds a job's profile by reading ``GET /profile?gpu=<uuid>&window=<s>`` on the
node agent while the job runs alone on that GPU. The answer is a
:class:`gpushare.api.profile.GpuProfile` in its one JSON codec; a counter the GPU cannot
measure is ``null`` and listed under ``unavailable`` so that no caller mistakes "not measured"
for "idle".
"""

import math
from collections.abc import Mapping
from typing import Any

from gpushare.api.profile import RATIOS, GpuProfile
from gpushare.node.exporter.sampler import GpmSampler
from gpushare.node.gpu.backend import GpuSample
from gpushare.packing.model import PipeProfile
from gpushare.packing.stored_profile import measured_pipe_profile

DEFAULT_WINDOW_S = 30.0
QUERY_PARAMS = ("gpu", "window")


class ProfileError(Exception):
    """A request the profiler refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, field: str, problem: str, fix: str) -> None:
        self.status = status
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field}: {problem}; {fix}")

    def to_json(self) -> dict[str, str]:
        return {"error": str(self), "field": self.field, "fix": self.fix}


def _weighted(values: list[tuple[float, float | int | None]]) -> float | None:
    present = [(w, float(v)) for w, v in values if v is not None]
    weight = sum(w for w, _ in present)
    if not present or weight <= 0:
        return None
    return sum(w * v for w, v in present) / weight


def average(
    samples: list[GpuSample], *, uuid: str, model: str, simulated: bool, window_s: float
) -> GpuProfile:
    """Average readings, each weighted by the GPU time its rates cover."""
    fields: dict[str, Any] = {
        c: _weighted([(t.span_s, t.counter(c)) for t in samples]) for c in RATIOS
    }
    memory = _weighted([(t.span_s, t.memory_used_bytes) for t in samples])
    mem_values = [t.memory_used_bytes for t in samples if t.memory_used_bytes]
    unavailable = tuple(k for k, v in fields.items() if v is None)
    if memory is None:
        unavailable = (*unavailable, "memory_used_bytes")
    return GpuProfile(
        gpu_uuid=uuid,
        gpu_model=model,
        simulated=simulated,
        window_seconds=window_s,
        sampled_seconds=round(sum(t.span_s for t in samples), 3),
        samples=len(samples),
        **fields,
        memory_used_bytes=memory,
        memory_used_bytes_max=max(mem_values) if mem_values else None,
        unavailable=unavailable,
    )


def pipe_profile_from_json(data: object) -> PipeProfile:
    """A ``/profile`` answer as the policy's ``PipeProfile`` (:class:`GpuProfile`'s codec,
    then ``packing.stored_profile.measured_pipe_profile``); raises InvalidInputError naming a
    malformed field or a counter that was not measured."""
    return measured_pipe_profile(GpuProfile.from_json(data))


class Profiler:
    """Answers profile queries from the sampler's history; never touches NVML itself."""

    def __init__(self, *, sampler: GpmSampler) -> None:
        self.sampler = sampler

    @property
    def max_window_s(self) -> float:
        return self.sampler.settings.history_s

    def profile(self, *, gpu: str, window_s: float) -> GpuProfile:
        info = self.sampler.gpu(gpu)
        if info is None:
            known = ", ".join(g.uuid for g in self.sampler.gpus()) or "none"
            raise ProfileError(
                404, "gpu", f"no GPU {gpu!r} on this node", f"use one of: {known} (or an index)"
            )
        samples = self.sampler.history(info.uuid, window_s=window_s)
        if not samples:
            raise ProfileError(
                503,
                "gpu",
                f"no reading of {info.uuid} in the last {window_s:g} s yet",
                f"retry after {self.sampler.settings.interval_s:g} s",
            )
        return average(
            samples,
            uuid=info.uuid,
            model=info.model,
            simulated=self.sampler.backend.simulated,
            window_s=window_s,
        )

    def parse_query(self, query: Mapping[str, str]) -> tuple[str, float]:
        """Validate ``gpu`` and ``window``; ProfileError(400) names the bad parameter."""
        unknown = sorted(set(query) - set(QUERY_PARAMS))
        if unknown:
            raise ProfileError(
                400,
                unknown[0],
                "is not a parameter of /profile",
                "use gpu=<uuid or index> and optionally window=<seconds>",
            )
        gpu = query.get("gpu", "").strip()
        if not gpu:
            raise ProfileError(
                400, "gpu", "is missing", "add gpu=<GPU UUID or index>, e.g. /profile?gpu=0"
            )
        raw = query.get("window", str(DEFAULT_WINDOW_S)).strip()
        fix = f"give window in seconds, 0 < window <= {self.max_window_s:g} (default 30)"
        try:
            window = float(raw.removesuffix("s"))
        except ValueError:
            raise ProfileError(400, "window", f"{raw!r} is not a number", fix) from None
        if not math.isfinite(window) or not 0 < window <= self.max_window_s:
            raise ProfileError(400, "window", f"{raw!r} is out of range", fix)
        return gpu, window

    def handle_query(self, query: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        """HTTP-framework-free handler: (status, JSON body)."""
        try:
            gpu, window = self.parse_query(query)
            return 200, self.profile(gpu=gpu, window_s=window).to_json()
        except ProfileError as exc:
            return exc.status, exc.to_json()
