"""The real GPU backend, over NVML (``nvidia-ml-py``'s ``pynvml``).

Inventory, processes (MPS clients included), counters (NVML utilization and memory, plus GPM
per-pipe rates on Hopper and newer) and XID/ECC health through an NVML event set. Nothing here
changes GPU settings: no compute mode, clocks or MIG calls.
"""

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpushare.api.inventory import GpuInfo
from gpushare.api.profile import PIPES
from gpushare.node.gpu.backend import GpuProcess, GpuSample, HealthEvent

log = logging.getLogger(__name__)

# GPM needs two samples at least this far apart.
GPM_MIN_INTERVAL_S = 0.1

GPM_METRIC_IDS: dict[str, int] = {
    "fp16": 13,  # NVML_GPM_METRIC_FP16_UTIL
    "fp32": 12,  # NVML_GPM_METRIC_FP32_UTIL
    "fp64": 11,  # NVML_GPM_METRIC_FP64_UTIL
    "tensor": 5,  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    "tensor_hmma": 7,  # NVML_GPM_METRIC_HMMA_TENSOR_UTIL
    "tensor_dmma": 6,  # NVML_GPM_METRIC_DFMA_TENSOR_UTIL (id 8, DMMA, reads 0)
    "tensor_imma": 9,  # NVML_GPM_METRIC_IMMA_TENSOR_UTIL
    "integer": 4,  # NVML_GPM_METRIC_INTEGER_UTIL
    "sm_utilization": 2,  # NVML_GPM_METRIC_SM_UTIL
    "sm_occupancy": 3,  # NVML_GPM_METRIC_SM_OCCUPANCY
    "dram_bandwidth": 10,  # NVML_GPM_METRIC_DRAM_BW_UTIL
}
"""The NVML GPM metric id of each counter of ``api.profile.RATIOS`` but ``utilization`` (NVML's
coarse utilization, no GPM metric), by its name of record."""

# XIDs caused by an application, not the GPU (NVIDIA's device plugin skips the same set):
# 13 graphics engine exception, 31 MMU fault, 43 GPU stopped processing, 45 preemptive
# cleanup, 68 video processor exception, 109 context switch timeout.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

# FP32 cores per SM by compute capability major, to derive SMs when NVML only gives cores.
_CORES_PER_SM = {7: 64, 8: 64, 9: 128, 10: 128, 12: 128}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class _GpmState:
    supported: bool
    previous: Any = None
    previous_time: float = 0.0
    last_values: dict[str, float | None] = field(default_factory=dict)


class NvmlBackend:
    """GpuBackend over NVML. One instance per process; NVML is initialised here, shut in close()."""

    def __init__(self) -> None:
        pynvml.nvmlInit()
        self._lock = threading.Lock()
        count = pynvml.nvmlDeviceGetCount()
        self._handles: dict[str, Any] = {}
        self._gpus: list[GpuInfo] = []
        for index in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            self._handles[uuid] = handle
            self._gpus.append(self._describe(index, uuid, handle))
        self._gpm: dict[str, _GpmState] = {u: self._gpm_init(h) for u, h in self._handles.items()}
        self._event_set: Any = None
        self._event_lock = threading.Lock()
        self._events_ready = False
        log.info(
            "NVML backend: %d GPU(s): %s",
            len(self._gpus),
            ", ".join(f"{g.index}:{g.model}:{g.uuid}" for g in self._gpus),
        )

    @property
    def name(self) -> str:
        return "nvml"

    @property
    def simulated(self) -> bool:
        return False

    @staticmethod
    def _describe(index: int, uuid: str, handle: Any) -> GpuInfo:
        model = _text(pynvml.nvmlDeviceGetName(handle))
        memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        try:
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            capability = f"{major}.{minor}"
        except pynvml.NVMLError:
            major, capability = 0, ""
        return GpuInfo(
            uuid=uuid,
            index=index,
            model=model,
            memory_bytes=memory,
            sm_count=_sm_count(handle, major),
            compute_capability=capability,
            healthy=True,
            mps_ready=False,
            simulated=False,
        )

    def inventory(self) -> list[GpuInfo]:
        return list(self._gpus)

    def _handle(self, uuid: str) -> Any:
        handle = self._handles.get(uuid)
        if handle is None:
            raise KeyError(f"no GPU {uuid} on this node")
        return handle

    def mig_enabled(self, uuid: str) -> bool:
        """True when MIG mode is on (current mode; a pending change counts from the next GPU
        reset). GPUs without MIG support report False. Read only: never changes the mode."""
        try:
            current, _pending = pynvml.nvmlDeviceGetMigMode(self._handle(uuid))
        except pynvml.NVMLError:
            return False
        return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)

    def device_paths(self, uuid: str) -> list[str]:
        """Host device nodes a container needs for this GPU (those that exist here)."""
        minor = int(pynvml.nvmlDeviceGetMinorNumber(self._handle(uuid)))
        wanted = [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            f"/dev/nvidia{minor}",
        ]
        return [path for path in wanted if os.path.exists(path)]

    def processes(self, uuid: str) -> list[GpuProcess]:
        """Compute processes with a context on the GPU; MPS clients flagged ``mps_client``.

        Under MPS, the compute list holds the MPS server and the MPS list holds each client with
        its own memory (docs/observability.md), so clients come from the MPS list and the rest
        from compute.
        """
        handle = self._handle(uuid)
        with self._lock:
            compute = _call_list(pynvml, "nvmlDeviceGetComputeRunningProcesses", handle)
            mps = _call_list(pynvml, "nvmlDeviceGetMPSComputeRunningProcesses", handle)
        clients = {int(p.pid): p for p in mps}
        result = [
            GpuProcess(pid=pid, used_memory_bytes=int(p.usedGpuMemory or 0), mps_client=True)
            for pid, p in clients.items()
        ]
        result.extend(
            GpuProcess(pid=int(p.pid), used_memory_bytes=int(p.usedGpuMemory or 0))
            for p in compute
            if int(p.pid) not in clients
        )
        return result

    def sample(self, uuid: str) -> GpuSample:
        handle = self._handle(uuid)
        with self._lock:
            try:
                util: float | None = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
            except pynvml.NVMLError:
                util = None
            try:
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
                used: int | None = int(mem.used)
                total: int | None = int(mem.total)
            except pynvml.NVMLError:
                used = total = None
            gpm = self._gpm_read(uuid, handle)
        pipes = {k: v for k, v in gpm.items() if k in PIPES}
        return GpuSample(
            uuid=uuid,
            timestamp=time.time(),
            utilization_ratio=util,
            memory_used_bytes=used,
            memory_total_bytes=total,
            pipes=pipes,
            sm_utilization_ratio=gpm.get("sm_utilization"),
            sm_occupancy_ratio=gpm.get("sm_occupancy"),
            dram_bandwidth_ratio=gpm.get("dram_bandwidth"),
        )

    # --- GPM -----------------------------------------------------------------------------

    @staticmethod
    def _gpm_init(handle: Any) -> _GpmState:
        try:
            supported = bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except (pynvml.NVMLError, AttributeError):
            supported = False
        state = _GpmState(supported=supported)
        if supported:
            try:
                state.previous = pynvml.nvmlGpmSampleGet(handle, pynvml.nvmlGpmSampleAlloc())
                state.previous_time = time.monotonic()
            except pynvml.NVMLError as exc:
                log.warning("GPM sampling failed, per-pipe metrics unavailable: %s", exc)
                state.supported = False
        return state

    def _gpm_read(self, uuid: str, handle: Any) -> dict[str, float | None]:
        """Rates over the interval since the previous reading (>= 100 ms; waits the rest once)."""
        state = self._gpm[uuid]
        if not state.supported:
            return {}
        elapsed = time.monotonic() - state.previous_time
        if elapsed < GPM_MIN_INTERVAL_S:
            if state.last_values:
                return dict(state.last_values)
            time.sleep(GPM_MIN_INTERVAL_S - elapsed)
        current = pynvml.nvmlGpmSampleGet(handle, pynvml.nvmlGpmSampleAlloc())
        now = time.monotonic()
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRIC_IDS)
        request.sample1 = state.previous
        request.sample2 = current
        for i, metric_id in enumerate(GPM_METRIC_IDS.values()):
            request.metrics[i].metricId = metric_id
        values: dict[str, float | None] = {}
        try:
            pynvml.nvmlGpmMetricsGet(request)
            for i, key in enumerate(GPM_METRIC_IDS):
                metric = request.metrics[i]
                ok = metric.nvmlReturn == pynvml.NVML_SUCCESS
                values[key] = min(1.0, max(0.0, metric.value / 100.0)) if ok else None
        except pynvml.NVMLError as exc:
            log.warning("GPM metrics read failed on %s: %s", uuid, exc)
            values = {}
        _free_sample(state.previous)
        state.previous, state.previous_time, state.last_values = current, now, values
        return dict(values)

    # --- health --------------------------------------------------------------------------

    def _ensure_event_set(self) -> None:
        if self._events_ready:
            return
        self._events_ready = True
        try:
            self._event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.warning("NVML event set unavailable, XID/ECC health not watched: %s", exc)
            return
        wanted = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
        for uuid, handle in self._handles.items():
            try:
                supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
                pynvml.nvmlDeviceRegisterEvents(handle, wanted & supported, self._event_set)
            except pynvml.NVMLError as exc:
                log.warning("GPU %s: health events not supported (%s); assumed healthy", uuid, exc)

    def wait_health_events(self, timeout_s: float) -> list[HealthEvent]:
        with self._event_lock:
            self._ensure_event_set()
            if self._event_set is None:
                time.sleep(timeout_s)
                return []
            try:
                data = pynvml.nvmlEventSetWait_v2(self._event_set, int(timeout_s * 1000))
            except pynvml.NVMLError as exc:
                if isinstance(exc, pynvml.NVMLError_Timeout):
                    return []
                log.warning("NVML event wait failed: %s", exc)
                time.sleep(timeout_s)
                return []
        uuid = _text(pynvml.nvmlDeviceGetUUID(data.device))
        if data.eventType == pynvml.nvmlEventTypeXidCriticalError:
            xid = int(data.eventData)
            if xid in APPLICATION_XIDS:
                log.info("GPU %s: XID %d is an application error; GPU stays healthy", uuid, xid)
                return []
            return [HealthEvent(uuid=uuid, healthy=False, reason=f"XID {xid}", xid=xid)]
        if data.eventType == pynvml.nvmlEventTypeDoubleBitEccError:
            return [HealthEvent(uuid=uuid, healthy=False, reason="double-bit ECC error")]
        return []

    def close(self) -> None:
        with self._event_lock:
            if self._event_set is not None:
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlEventSetFree(self._event_set)
                self._event_set = None
        for state in self._gpm.values():
            _free_sample(state.previous)
            state.previous = None
        pynvml.nvmlShutdown()


def _free_sample(sample: Any) -> None:
    if sample is None:
        return
    with contextlib.suppress(pynvml.NVMLError):
        pynvml.nvmlGpmSampleFree(sample)


def _call_list(module: Any, name: str, handle: Any) -> list[Any]:
    """Call an NVML process-list function; [] where the driver or binding lacks it."""
    fn = getattr(module, name, None)
    if fn is None:
        return []
    try:
        return list(fn(handle))
    except pynvml.NVMLError:
        return []


def _sm_count(handle: Any, capability_major: int) -> int:
    """Streaming multiprocessors: NVML's device attributes, else cores / cores-per-SM."""
    try:
        count = int(pynvml.nvmlDeviceGetAttributes(handle).multiprocessorCount)
        if count > 0:
            return count
    except (pynvml.NVMLError, AttributeError):
        pass
    try:
        cores = int(pynvml.nvmlDeviceGetNumGpuCores(handle))
    except (pynvml.NVMLError, AttributeError):
        return 0
    per_sm = _CORES_PER_SM.get(capability_major, 0)
    return cores // per_sm if per_sm else 0
