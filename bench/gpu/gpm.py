"""Per-pipe GPU counters sampled while a job runs alone: the job's profile.

Prefers gpushare's own NVML backend (``gpushare.node.gpu.nvml``, the node agent's profiler source)
when it is importable; otherwise a minimal NVML GPM reader here does the same reads. Either
way a background thread samples every ``period_s`` (GPM needs >= 100 ms between samples) and
``profile(start, end)`` averages the readings that fall inside a window.
"""

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.gpu.stats import mean
from gpushare.api.profile import PLACEMENT_COUNTERS

log = logging.getLogger("bench.gpu")

PROFILE_KEYS = PLACEMENT_COUNTERS
"""The counters of record a job's profile needs (``gpushare.api.profile``)."""
OPTIONAL_PROFILE_KEYS = ("sm_utilization",)
"""Recorded when measured: the interference model counts SM sharing with it."""


@dataclass(frozen=True)
class Reading:
    start: float
    end: float
    values: dict[str, float]


class _LocalGpm:
    """Minimal NVML GPM reader: rates between two consecutive samples."""

    source = "bench.gpu.gpm (NVML GPM via nvidia-ml-py)"

    def __init__(self, index: int) -> None:
        import pynvml  # noqa: PLC0415  (optional: absent where there is no GPU)

        # The product's GPM ids of the counters of record (imported here: needs pynvml).
        from gpushare.node.gpu.nvml import GPM_METRIC_IDS  # noqa: PLC0415

        self.ids = GPM_METRIC_IDS
        self.nv: Any = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        support = pynvml.nvmlGpmQueryDeviceSupport(self.handle)
        if not support.isSupportedDevice:
            raise RuntimeError("this GPU does not support NVML GPM (needs Hopper or newer)")
        self.prev = pynvml.nvmlGpmSampleAlloc()
        self.cur = pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(self.handle, self.prev)

    def read(self) -> dict[str, float]:
        nv = self.nv
        nv.nvmlGpmSampleGet(self.handle, self.cur)
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(self.ids)
        req.sample1 = self.prev
        req.sample2 = self.cur
        for i, metric in enumerate(self.ids.values()):
            req.metrics[i].metricId = metric
        nv.nvmlGpmMetricsGet(req)
        out: dict[str, float] = {}
        for i, key in enumerate(self.ids):
            if req.metrics[i].nvmlReturn == 0:
                out[key] = max(0.0, min(1.0, req.metrics[i].value / 100.0))
        util = nv.nvmlDeviceGetUtilizationRates(self.handle)
        out["utilization"] = util.gpu / 100.0
        self.prev, self.cur = self.cur, self.prev
        return out

    def close(self) -> None:
        for s in (self.prev, self.cur):
            self.nv.nvmlGpmSampleFree(s)
        self.nv.nvmlShutdown()


class _GpushareProfiler:
    """gpushare's own profiler: the node agent's GPM sampler + profile averaging."""

    source = "gpushare.node.exporter.profiler (gpushare.node.gpu.nvml backend)"

    def __init__(self, index: int, period_s: float) -> None:
        # Imported here: the node agent's modules are optional for the benchmark.
        from gpushare.node.exporter.profiler import Profiler, pipe_profile_from_json  # noqa: PLC0415
        from gpushare.node.exporter.sampler import GpmSampler, SamplerSettings  # noqa: PLC0415
        from gpushare.node.gpu.nvml import NvmlBackend  # noqa: PLC0415

        self.backend = NvmlBackend()
        self.sampler = GpmSampler(
            backend=self.backend,
            settings=SamplerSettings(interval_s=period_s, history_s=300.0),
        )
        self.profiler = Profiler(sampler=self.sampler)
        self.to_profile = pipe_profile_from_json
        self.gpu = str(index)
        self.sampler.start()

    def profile_last(self, window_s: float) -> dict[str, float] | None:
        data = self.profiler.profile(gpu=self.gpu, window_s=window_s).to_json()
        self.to_profile(data)  # raises, naming the counter, when GPM could not measure one
        return {k: float(v) for k, v in data.items() if isinstance(v, int | float)}

    def close(self) -> None:
        self.sampler.stop()
        self.backend.close()


class _LocalProfiler:
    """Fallback: the minimal GPM reader above, sampled by a thread of our own."""

    source = _LocalGpm.source

    def __init__(self, index: int, period_s: float) -> None:
        self.reader = _LocalGpm(index)
        self.period_s = period_s
        self.readings: list[Reading] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="gpm")
        self._thread.start()

    def _loop(self) -> None:
        last = time.time()
        while not self._stop.wait(self.period_s):
            try:
                values = self.reader.read()
            except Exception as exc:
                log.warning("GPM read failed: %s", exc)
                continue
            now = time.time()
            self.readings.append(Reading(last, now, values))
            last = now

    def profile_last(self, window_s: float) -> dict[str, float] | None:
        now = time.time()
        return window_average(self.readings, now - window_s, now + 1.0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.reader.close()


class Sampler:
    """Profiles of whatever ran on the GPU in the last few seconds.

    Uses gpushare's own profiler when importable, else the local GPM reader; ``source`` says
    which, and the report records it.
    """

    def __init__(self, *, index: int = 0, period_s: float = 0.2, prefer_gpushare: bool = True):
        period_s = max(period_s, 0.1)
        self.impl: Any = None
        self.error = ""
        makers: list[Callable[[int, float], Any]] = [_LocalProfiler]
        if prefer_gpushare:
            makers.insert(0, _GpushareProfiler)
        for make in makers:
            try:
                self.impl = make(index, period_s)
                break
            except Exception as exc:  # try the next source, remember why
                self.error += f"{make.__name__}: {type(exc).__name__}: {exc}; "
        self.source = self.impl.source if self.impl else "unavailable"
        log.info("profile source: %s %s", self.source, self.error)

    @property
    def available(self) -> bool:
        return self.impl is not None

    def profile_last(self, window_s: float) -> dict[str, float] | None:
        """Averages of the counters over the last ``window_s`` seconds, None if unavailable."""
        if self.impl is None:
            return None
        try:
            result: dict[str, float] | None = self.impl.profile_last(window_s)
        except Exception as exc:
            log.warning("profile read failed (%s): %s", self.source, exc)
            self.error += f"profile: {exc}; "
            return None
        return result

    def close(self) -> None:
        if self.impl is not None:
            self.impl.close()


def window_average(readings: list[Reading], start: float, end: float) -> dict[str, float] | None:
    inside = [r for r in readings if r.start >= start and r.end <= end]
    if not inside:
        return None
    keys = sorted({k for r in inside for k in r.values})
    return {k: mean([r.values[k] for r in inside if k in r.values]) for k in keys}


def to_profile(values: dict[str, float] | None) -> dict[str, float]:
    """The six profile numbers of record (0-1); missing counters read as 0 and are logged."""
    values = values or {}
    missing = [k for k in PROFILE_KEYS if k not in values]
    if missing:
        log.warning("profile lacks %s; recorded as 0", ",".join(missing))
    out = {k: round(values.get(k, 0.0), 4) for k in PROFILE_KEYS}
    out.update({k: round(values[k], 4) for k in OPTIONAL_PROFILE_KEYS if k in values})
    return out
