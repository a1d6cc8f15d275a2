"""Background sampling of every GPU, so that scrapes and profile requests never wait on NVML.

GPM counters are rates between two readings taken at least 100 ms apart; one thread reads
every GPU once per ``interval_s`` (default 1 s), keeps the latest reading for the collector and
a bounded history for the profiler, and resolves the owners of GPU processes (a /proc read per
new PID) off the scrape path too.
"""

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo
from gpushare.node.core.cgroups import CgroupOwner
from gpushare.node.exporter.attribution import ProcessResolver
from gpushare.node.gpu.backend import GpuBackend, GpuSample

log = logging.getLogger(__name__)

MIN_INTERVAL_S = 0.1
"""NVML GPM needs readings at least this far apart."""
GPM_MIN_COMPUTE_CAPABILITY = (9, 0)
"""GPM exists on Hopper and newer only."""


def has_gpm(info: GpuInfo) -> bool:
    """False for GPUs older than Hopper; unknown capabilities are trusted to the backend."""
    try:
        major, _, minor = info.compute_capability.partition(".")
        capability = (int(major), int(minor or 0))
    except ValueError:
        return True
    return capability >= GPM_MIN_COMPUTE_CAPABILITY


def without_gpm(sample: GpuSample) -> GpuSample:
    """The sample with every GPM-derived counter marked unavailable."""
    return replace(
        sample,
        pipes={},
        sm_utilization_ratio=None,
        sm_occupancy_ratio=None,
        dram_bandwidth_ratio=None,
    )


@dataclass(frozen=True)
class SamplerSettings:
    interval_s: float = 1.0
    """Gap between two readings of a GPU; at least 0.1 s (GPM's minimum)."""
    history_s: float = 600.0
    """How far back the profiler can average; bounds memory to history_s / interval_s readings."""
    inventory_refresh_s: float = 60.0
    """How often the GPU list is re-read (GPUs rarely change while the agent runs)."""
    stale_after_s: float | None = None
    """A reading older than this is not exported (a hung NVML call must not look live);
    default: 5 intervals plus 2 s."""
    proc_root: Path = Path("/proc")
    """The host's /proc (the agent runs with hostPID, or mounts it elsewhere)."""

    def __post_init__(self) -> None:
        if not self.interval_s >= MIN_INTERVAL_S:
            raise InvalidInputError(
                "sample_interval_s",
                f"{self.interval_s} s is shorter than GPM's minimum of {MIN_INTERVAL_S} s",
                f"use at least {MIN_INTERVAL_S} s (default 1 s)",
            )
        if not self.history_s >= self.interval_s:
            raise InvalidInputError(
                "history_s",
                f"{self.history_s} s is shorter than the sample interval",
                "keep at least one interval of history (default 600 s)",
            )

    @property
    def stale_s(self) -> float:
        return self.stale_after_s if self.stale_after_s is not None else 5 * self.interval_s + 2


@dataclass(frozen=True)
class ProcessReading:
    """A process with a context on a GPU, with the pod that owns it when known."""

    pid: int
    used_memory_bytes: int
    mps_client: bool
    owner: CgroupOwner | None


@dataclass(frozen=True)
class GpuReading:
    """The newest state of one GPU as the sampler last saw it."""

    info: GpuInfo
    latest: GpuSample | None
    processes: tuple[ProcessReading, ...] | None
    errors: int = 0
    last_error: str | None = None


@dataclass
class _GpuState:
    info: GpuInfo
    history: deque[GpuSample]
    processes: tuple[ProcessReading, ...] | None = None
    errors: int = 0
    last_error: str | None = None
    last_at: float | None = None


@dataclass
class _Stats:
    passes: int = 0
    errors: int = 0
    cpu_seconds: float = 0.0
    started_at: float | None = None
    last_pass_s: float = 0.0


class GpmSampler:
    """Reads every GPU of ``backend`` every ``settings.interval_s`` in a daemon thread."""

    def __init__(
        self,
        *,
        backend: GpuBackend,
        settings: SamplerSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.backend = backend
        self.settings = settings or SamplerSettings()
        self._clock = clock
        self._sleep = sleep
        self._resolver = ProcessResolver(proc_root=self.settings.proc_root)
        self._lock = threading.Lock()
        self._gpus: dict[str, _GpuState] = {}
        self._order: list[str] = []
        self._inventory_at: float | None = None
        self._stats = _Stats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._maxlen = max(2, int(self.settings.history_s / self.settings.interval_s) + 2)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Take a first reading now (so the first scrape has data), then keep sampling."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._stats.started_at = self._clock()
        self._thread = threading.Thread(target=self._run, name="gpushare-gpm-sampler", daemon=True)
        self._thread.start()

    def stop(self, *, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        interval = self.settings.interval_s
        while not self._stop.is_set():
            started = self._clock()
            cpu0 = time.thread_time()
            self.sample_once()
            with self._lock:
                self._stats.cpu_seconds += time.thread_time() - cpu0
            # Never burst to catch up after a slow pass: the next pass starts one interval
            # after this one started, or right away if this pass took longer than that.
            self._stop.wait(max(0.0, started + interval - self._clock()))

    # -- one pass --------------------------------------------------------------------------
    def sample_once(self) -> None:
        """Read every GPU once. Errors are counted per GPU and never stop the loop."""
        start = self._clock()
        self._refresh_inventory(start)
        live_pids: set[int] = set()
        for uuid in list(self._order):
            state = self._gpus[uuid]
            if state.last_at is not None:
                # GPM rates over less than 100 ms are not valid; a pass that follows a slow
                # one must not read a GPU early.
                early = MIN_INTERVAL_S - (self._clock() - state.last_at)
                if early > 0:
                    self._sleep(early)
            try:
                sample = self.backend.sample(uuid)
                if not has_gpm(state.info):
                    # Whatever a backend says, a pre-Hopper GPU measured no pipe: never export
                    # such numbers (they would read as idle pipes).
                    sample = without_gpm(sample)
                procs = self.backend.processes(uuid)
            except Exception as exc:
                log.warning("reading GPU %s failed: %s", uuid, exc)
                with self._lock:
                    state.errors += 1
                    state.last_error = str(exc)
                    self._stats.errors += 1
                continue
            at = self._clock()
            readings = tuple(
                ProcessReading(
                    pid=p.pid,
                    used_memory_bytes=p.used_memory_bytes,
                    mps_client=p.mps_client,
                    owner=self._resolver.resolve(p.pid),
                )
                for p in procs
            )
            live_pids.update(p.pid for p in procs)
            with self._lock:
                span = at - state.last_at if state.last_at is not None else None
                state.last_at = at
                state.history.append(
                    replace(sample, at=at, span_s=span or self.settings.interval_s)
                )
                state.processes = readings
        self._resolver.forget_except(live_pids)
        with self._lock:
            self._stats.passes += 1
            self._stats.last_pass_s = self._clock() - start

    def _refresh_inventory(self, now: float) -> None:
        if (
            self._inventory_at is not None
            and now - self._inventory_at < self.settings.inventory_refresh_s
        ):
            return
        try:
            inventory = self.backend.inventory()
        except Exception as exc:
            log.warning("reading the GPU inventory failed: %s", exc)
            with self._lock:
                self._stats.errors += 1
            return
        self._inventory_at = now
        with self._lock:
            known = {g.uuid: g for g in inventory}
            for uuid in [u for u in self._gpus if u not in known]:
                del self._gpus[uuid]
            for info in inventory:
                if info.uuid in self._gpus:
                    self._gpus[info.uuid].info = info
                else:
                    self._gpus[info.uuid] = _GpuState(info=info, history=deque(maxlen=self._maxlen))
            self._order = [g.uuid for g in inventory]

    # -- readers (called from scrape and HTTP threads) ------------------------------------
    def readings(self) -> list[GpuReading]:
        """The newest reading of every GPU, in index order; stale readings come back as
        ``latest=None`` so nothing old is exported as if it were live."""
        now = self._clock()
        stale = self.settings.stale_s
        with self._lock:
            result = []
            for uuid in self._order:
                st = self._gpus[uuid]
                latest = st.history[-1] if st.history else None
                fresh = latest is not None and now - latest.at <= stale
                result.append(
                    GpuReading(
                        info=st.info,
                        latest=latest if fresh else None,
                        processes=st.processes if fresh else None,
                        errors=st.errors,
                        last_error=st.last_error,
                    )
                )
            return result

    def sample_age_s(self, uuid: str) -> float | None:
        with self._lock:
            st = self._gpus.get(uuid)
            if st is None or not st.history:
                return None
            return self._clock() - st.history[-1].at

    def history(self, uuid: str, *, window_s: float) -> list[GpuSample]:
        """Readings of one GPU whose covered time falls in the last ``window_s`` seconds."""
        now = self._clock()
        with self._lock:
            st = self._gpus.get(uuid)
            if st is None:
                return []
            return [s for s in st.history if s.at - s.span_s >= now - window_s - 1e-9]

    def gpu(self, key: str) -> GpuInfo | None:
        """Find a GPU by UUID or by index."""
        with self._lock:
            if key in self._gpus:
                return self._gpus[key].info
            for st in self._gpus.values():
                if str(st.info.index) == key:
                    return st.info
        return None

    def gpus(self) -> list[GpuInfo]:
        with self._lock:
            return [self._gpus[u].info for u in self._order]

    @property
    def cpu_seconds(self) -> float:
        """CPU time the sampler thread has used so far."""
        with self._lock:
            return self._stats.cpu_seconds

    @property
    def passes(self) -> int:
        with self._lock:
            return self._stats.passes

    @property
    def errors(self) -> int:
        with self._lock:
            return self._stats.errors

    @property
    def last_pass_s(self) -> float:
        with self._lock:
            return self._stats.last_pass_s
