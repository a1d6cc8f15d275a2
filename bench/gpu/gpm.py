"""Per-pipe GPU counters sampled while a job runs alone: the job's profile.

gpushare's own node-agent profiler does the reads (``gpushare.node.exporter.profiler`` over
the ``gpushare.node.gpu.nvml`` backend): a background sampler every ``period_s`` (GPM needs
>= 100 ms between samples), and :meth:`Sampler.profile_last` averages the last window into the
product's one profile record, ``gpushare.api.profile.GpuProfile``. Where the product's NVML
backend cannot run (no NVML, no GPM), the sampler is unavailable and no job is profiled, as
the product's operator cannot profile one there.
"""

import logging
from collections.abc import Mapping

from gpushare.api.profile import PLACEMENT_COUNTERS, GpuProfile

log = logging.getLogger("bench.gpu")

PROFILE_KEYS = PLACEMENT_COUNTERS
"""The counters of record a job's profile needs (``gpushare.api.profile``)."""
OPTIONAL_PROFILE_KEYS = ("sm_utilization", "utilization")
"""Recorded when measured: the interference model counts SM sharing with the first, and a job
that sleeps between bursts by the second (its kernel time, ``interference.while_running``)."""


class _GpushareProfiler:
    """gpushare's own profiler: the node agent's GPM sampler + profile averaging."""

    source = "gpushare.node.exporter.profiler (gpushare.node.gpu.nvml backend)"

    def __init__(self, index: int, period_s: float) -> None:
        # Imported here: the node agent's modules are optional for the benchmark.
        from gpushare.node.exporter.profiler import Profiler  # noqa: PLC0415
        from gpushare.node.exporter.sampler import GpmSampler, SamplerSettings  # noqa: PLC0415
        from gpushare.node.gpu.nvml import NvmlBackend  # noqa: PLC0415

        self.backend = NvmlBackend()
        self.sampler = GpmSampler(
            backend=self.backend,
            settings=SamplerSettings(interval_s=period_s, history_s=300.0),
        )
        self.profiler = Profiler(sampler=self.sampler)
        self.gpu = str(index)
        self.sampler.start()

    def profile_last(self, window_s: float) -> GpuProfile:
        return self.profiler.profile(gpu=self.gpu, window_s=window_s)

    def close(self) -> None:
        self.sampler.stop()
        self.backend.close()


class Sampler:
    """Profiles of whatever ran on the GPU in the last few seconds, by gpushare's profiler;
    ``source`` says so, and the report records it (``unavailable`` and why where it cannot
    run)."""

    def __init__(self, *, index: int = 0, period_s: float = 0.2):
        self.impl: _GpushareProfiler | None = None
        self.error = ""
        try:
            self.impl = _GpushareProfiler(index, max(period_s, 0.1))
        except Exception as exc:  # no NVML or GPM here: no job is profiled, and the run says so
            self.error = f"{type(exc).__name__}: {exc}"
        self.source = self.impl.source if self.impl else f"unavailable ({self.error})"
        log.info("profile source: %s", self.source)

    @property
    def available(self) -> bool:
        return self.impl is not None

    def profile_last(self, window_s: float) -> GpuProfile | None:
        """The product's profile of the last ``window_s`` seconds, None if unavailable."""
        if self.impl is None:
            return None
        try:
            return self.impl.profile_last(window_s)
        except Exception as exc:
            log.warning("profile read failed (%s): %s", self.source, exc)
            self.error += f"profile: {exc}; "
            return None

    def close(self) -> None:
        if self.impl is not None:
            self.impl.close()


def to_profile(profile: GpuProfile | None) -> dict[str, float]:
    """The six profile numbers of record (0-1) of the product's record, as the results keep
    them; counters it did not measure read as 0 and are logged."""
    values = (
        {k: profile.ratio(k) for k in (*PROFILE_KEYS, *OPTIONAL_PROFILE_KEYS)} if profile else {}
    )
    missing = [k for k in PROFILE_KEYS if values.get(k) is None]
    if missing:
        log.warning("profile lacks %s; recorded as 0", ",".join(missing))
    out = {k: round(values.get(k) or 0.0, 4) for k in PROFILE_KEYS}
    out.update({k: round(v, 4) for k in OPTIONAL_PROFILE_KEYS if (v := values.get(k)) is not None})
    return out


def with_kernel_time(
    values: Mapping[str, float], raw: Mapping[str, float] | None
) -> Mapping[str, float]:
    """A kept profile with the kernel time (NVML utilization) of its raw measurement, where
    the profile was kept before the benchmark recorded it (a stored phase A), as the product
    stores it with every profile."""
    if "utilization" in values or not raw or raw.get("utilization") is None:
        return values
    return {**values, "utilization": raw["utilization"]}
