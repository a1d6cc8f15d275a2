"""The node exporter: a prometheus-client Collector that builds every series at scrape time.

Nothing is kept between scrapes, so a pod that left or a GPU that fell off leaves no stale
series. The collector only reads what the background sampler, the agent's pod view and the
MPS manager already hold: a scrape never calls NVML or the Kubernetes API.

Unavailable counters (no GPM before Hopper, a reading that failed or went stale) are omitted
and flagged by ``gpushare_gpu_metric_available{metric=...} 0``, never exported as zeros. Every
series carries ``simulated="true"`` when the backend is the simulated one.
"""

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpushare.api.inventory import GpuInfo
from gpushare.api.names import SLICES_PER_GPU
from gpushare.api.profile import PIPES
from gpushare.node.core.allocations import PodAllocation
from gpushare.node.exporter.health import HealthRecorder
from gpushare.node.exporter.podresources import ContainerDevices
from gpushare.node.exporter.sampler import GpmSampler, GpuReading, ProcessReading
from gpushare.node.gpu.backend import GpuSample

log = logging.getLogger(__name__)
_T = TypeVar("_T")

GPU_LABELS = ("node", "gpu_uuid", "gpu_index", "model", "simulated")
POD_LABELS = ("node", "namespace", "pod", "gpu_uuid", "simulated")

# Metric label values of gpushare_gpu_metric_available, one per optional series.
AVAILABLE_PIPE = "gpushare_gpu_pipe_utilization_ratio"
AVAILABLE_SCALARS = (
    "gpushare_gpu_sm_utilization_ratio",
    "gpushare_gpu_sm_occupancy_ratio",
    "gpushare_gpu_dram_bandwidth_utilization_ratio",
    "gpushare_gpu_utilization_ratio",
    "gpushare_gpu_memory_used_bytes",
    "gpushare_pod_gpu_memory_used_bytes",
    "gpushare_mps_daemon_up",
)


@dataclass(frozen=True)
class MpsDaemonStatus:
    """What the MPS manager knows about one GPU's control daemon."""

    up: bool
    clients: int | None = None
    """Client processes connected; None to let the exporter count NVML's MPS clients."""


@dataclass(frozen=True)
class _Owner:
    namespace: str
    pod: str
    container: str


class GpuShareCollector(Collector):
    """Per-scrape collector for one node's GPUs, allocations, pods and MPS daemons."""

    def __init__(
        self,
        *,
        node_name: str,
        sampler: GpmSampler,
        placements: Callable[[], Iterable[PodAllocation]],
        mps_status: Callable[[], Mapping[str, MpsDaemonStatus]] | None = None,
        health: HealthRecorder | None = None,
        pod_resources: Callable[[], Sequence[ContainerDevices]] | None = None,
    ) -> None:
        self.node_name = node_name
        self.sampler = sampler
        self.placements = placements
        self.mps_status = mps_status
        self.health = health or HealthRecorder()
        self.pod_resources = pod_resources
        self.simulated = "true" if sampler.backend.simulated else "false"
        self.backend_name = sampler.backend.name
        self._source_errors = 0

    def describe(self) -> Iterable[Metric]:
        # Collected per scrape; nothing to pre-register (and no scrape at registration time).
        return []

    def _gpu_labels(self, info: GpuInfo) -> list[str]:
        return [self.node_name, info.uuid, str(info.index), info.model, self.simulated]

    def _call(self, what: str, source: Callable[[], _T], default: _T) -> _T:
        """Read a source owned by another component; a failing one drops its series only."""
        try:
            return source()
        except Exception as exc:
            self._source_errors += 1
            log.warning("exporter could not read %s: %s", what, exc)
            return default

    def collect(self) -> Iterator[Metric]:
        readings = self.sampler.readings()
        no_allocs: Iterable[PodAllocation] = []
        allocs = list(self._call("placements", self.placements, no_allocs))
        mps = self._call("MPS status", self.mps_status, None) if self.mps_status else None
        no_resources: Sequence[ContainerDevices] = []
        resources = (
            self._call("kubelet pod resources", self.pod_resources, no_resources)
            if self.pod_resources
            else no_resources
        )
        yield from self._gpu_families(readings)
        yield from self._allocation_families(readings, allocs)
        yield from self._pod_memory_families(readings, allocs, resources)
        yield from self._mps_families(readings, mps)
        yield from self._health_families(readings)
        yield from self._self_families(readings)

    # -- GPU counters ----------------------------------------------------------------------
    def _gpu_families(self, readings: list[GpuReading]) -> Iterator[Metric]:
        """Each GPU's info, counters and memory, and which optional series it has."""
        families = _GpuFamilies.new()
        for r in readings:
            self._add_gpu(families, r)
        yield from families.all()

    def _add_gpu(self, f: "_GpuFamilies", r: GpuReading) -> None:
        """One GPU's series; a counter without a fresh reading is flagged unavailable."""
        labels = self._gpu_labels(r.info)
        f.info.add_metric(
            [
                *labels,
                r.info.compute_capability,
                str(r.info.memory_bytes),
                self.backend_name,
            ],
            1.0,
        )
        sample = r.latest
        total = (
            sample.memory_total_bytes
            if sample is not None and sample.memory_total_bytes is not None
            else r.info.memory_bytes
        )
        f.mem_total.add_metric(labels, float(total))
        for pipe in PIPES:
            value = sample.pipes.get(pipe) if sample is not None else None
            f.available.add_metric([*labels, AVAILABLE_PIPE, pipe], float(value is not None))
            if value is not None:
                f.pipe.add_metric([*labels, pipe], value)
        for name, value in _scalar_values(sample).items():
            f.available.add_metric([*labels, name, ""], float(value is not None))
            if value is None:
                continue
            if name == "gpushare_gpu_memory_used_bytes":
                f.mem_used.add_metric(labels, float(value))
            else:
                f.scalars[name].add_metric(labels, float(value))
        f.available.add_metric(
            [*labels, "gpushare_pod_gpu_memory_used_bytes", ""], float(r.processes is not None)
        )

    # -- allocations from placements ------------------------------------------------------
    def _allocation_families(
        self, readings: list[GpuReading], allocs: list[PodAllocation]
    ) -> Iterator[Metric]:
        compute = GaugeMetricFamily(
            "gpushare_gpu_allocated_compute_ratio",
            "Sum of the compute shares guaranteed to pods placed on this GPU.",
            labels=GPU_LABELS,
        )
        limits = GaugeMetricFamily(
            "gpushare_gpu_limit_compute_ratio",
            "Sum of the MPS thread caps (limits) of pods placed on this GPU; above the "
            "allocated (guaranteed) ratio when pods may use room their neighbours leave.",
            labels=GPU_LABELS,
        )
        memory = GaugeMetricFamily(
            "gpushare_gpu_allocated_memory_bytes",
            "Sum of the memory limits of pods placed on this GPU.",
            labels=GPU_LABELS,
        )
        pods = GaugeMetricFamily("gpushare_gpu_pods", "Pods placed on this GPU.", labels=GPU_LABELS)
        pod_compute = GaugeMetricFamily(
            "gpushare_pod_gpu_allocated_compute_ratio",
            "Compute share guaranteed to the pod on this GPU (its request).",
            labels=[*POD_LABELS, "class"],
        )
        pod_threads = GaugeMetricFamily(
            "gpushare_pod_gpu_active_thread_ratio",
            "MPS active-thread percentage of the pod's processes, as a ratio (its limit).",
            labels=POD_LABELS,
        )
        pod_limit = GaugeMetricFamily(
            "gpushare_pod_gpu_memory_limit_bytes",
            "MPS pinned device memory limit of the pod on this GPU.",
            labels=POD_LABELS,
        )
        by_gpu: dict[str, list[PodAllocation]] = defaultdict(list)
        for a in allocs:
            for uuid in a.gpu_uuids:
                by_gpu[uuid].append(a)
        for r in readings:
            labels = self._gpu_labels(r.info)
            placed = by_gpu.get(r.info.uuid, [])
            compute.add_metric(labels, sum(a.compute_ratio for a in placed))
            limits.add_metric(labels, sum(a.thread_percent for a in placed) / SLICES_PER_GPU)
            memory.add_metric(labels, float(sum(a.memory_limit_bytes for a in placed)))
            pods.add_metric(labels, float(len(placed)))
            for a in placed:
                plabels = [self.node_name, a.namespace, a.name, r.info.uuid, self.simulated]
                pod_compute.add_metric([*plabels, a.gpu_class], a.compute_ratio)
                pod_threads.add_metric(plabels, a.thread_percent / 100)
                if a.memory_limit_bytes:
                    pod_limit.add_metric(plabels, float(a.memory_limit_bytes))
        yield from (compute, limits, memory, pods, pod_compute, pod_threads, pod_limit)

    # -- per-pod memory -------------------------------------------------------------------
    def _owner_of(
        self,
        proc: ProcessReading,
        uuid: str,
        by_uid: Mapping[str, PodAllocation],
        resources: Sequence[ContainerDevices],
    ) -> _Owner | None:
        owner = proc.owner
        if owner is None:
            return None
        alloc = by_uid.get(owner.pod_uid)
        if alloc is not None:
            container = alloc.containers.get(owner.container_id or "", "")
            return _Owner(alloc.namespace, alloc.name, container)
        # Not a pod the agent told us about: the kubelet knows which container holds this
        # GPU; that identifies the owner only when exactly one container does.
        holders = [e for e in resources if uuid in e.gpu_uuids()]
        if len({(e.namespace, e.pod, e.container) for e in holders}) == 1:
            return _Owner(holders[0].namespace, holders[0].pod, holders[0].container)
        return None

    def _pod_memory_families(
        self,
        readings: list[GpuReading],
        allocs: list[PodAllocation],
        resources: Sequence[ContainerDevices],
    ) -> Iterator[Metric]:
        used = GaugeMetricFamily(
            "gpushare_pod_gpu_memory_used_bytes",
            "GPU memory held by the pod's processes (NVML per process, PID -> cgroup -> pod).",
            labels=[*POD_LABELS[:3], "container", "gpu_uuid", "simulated"],
        )
        unattributed = GaugeMetricFamily(
            "gpushare_gpu_unattributed_memory_used_bytes",
            "GPU memory held by processes outside any known pod (the MPS server, host tools).",
            labels=GPU_LABELS,
        )
        by_uid = {a.uid: a for a in allocs if a.uid}
        for r in readings:
            if r.processes is None:
                continue
            totals: dict[_Owner, int] = defaultdict(int)
            rest = 0
            for proc in r.processes:
                owner = self._owner_of(proc, r.info.uuid, by_uid, resources)
                if owner is None:
                    rest += proc.used_memory_bytes
                else:
                    totals[owner] += proc.used_memory_bytes
            for owner, total in sorted(totals.items(), key=lambda kv: (kv[0].namespace, kv[0].pod)):
                used.add_metric(
                    [
                        self.node_name,
                        owner.namespace,
                        owner.pod,
                        owner.container,
                        r.info.uuid,
                        self.simulated,
                    ],
                    float(total),
                )
            unattributed.add_metric(self._gpu_labels(r.info), float(rest))
        yield used
        yield unattributed

    # -- MPS --------------------------------------------------------------------------------
    def _mps_families(
        self, readings: list[GpuReading], mps: Mapping[str, MpsDaemonStatus] | None
    ) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "gpushare_mps_daemon_up",
            "1 when the GPU's MPS control daemon answers, 0 when it is down.",
            labels=GPU_LABELS,
        )
        clients = GaugeMetricFamily(
            "gpushare_mps_clients",
            "MPS client processes on this GPU (one server takes at most 48).",
            labels=GPU_LABELS,
        )
        for r in readings:
            labels = self._gpu_labels(r.info)
            status = mps.get(r.info.uuid) if mps is not None else None
            if mps is not None:
                up.add_metric(labels, float(status is not None and status.up))
            if status is not None and status.clients is not None:
                clients.add_metric(labels, float(status.clients))
            elif r.processes is not None:
                clients.add_metric(labels, float(sum(p.mps_client for p in r.processes)))
        yield up
        yield clients

    # -- health -----------------------------------------------------------------------------
    def _health_families(self, readings: list[GpuReading]) -> Iterator[Metric]:
        xids = CounterMetricFamily(
            "gpushare_gpu_xid_errors",
            "XID errors reported by the driver for this GPU since the agent started.",
            labels=GPU_LABELS,
        )
        last = GaugeMetricFamily(
            "gpushare_gpu_last_xid", "Code of the GPU's most recent XID error.", labels=GPU_LABELS
        )
        healthy = GaugeMetricFamily(
            "gpushare_gpu_healthy",
            "1 while the GPU is healthy, 0 after a fatal error.",
            labels=GPU_LABELS,
        )
        for r in readings:
            labels = self._gpu_labels(r.info)
            h = self.health.get(r.info.uuid)
            xids.add_metric(labels, float(h.xid_errors))
            if h.last_xid is not None:
                last.add_metric(labels, float(h.last_xid))
            healthy.add_metric(labels, float(h.healthy and r.info.healthy))
        yield xids
        yield last
        yield healthy

    # -- the exporter itself ----------------------------------------------------------------
    def _self_families(self, readings: list[GpuReading]) -> Iterator[Metric]:
        node = [self.node_name, self.simulated]
        age = GaugeMetricFamily(
            "gpushare_exporter_sample_age_seconds",
            "Age of the newest reading of this GPU (readings older than the stale limit are "
            "not exported).",
            labels=GPU_LABELS,
        )
        for r in readings:
            a = self.sampler.sample_age_s(r.info.uuid)
            if a is not None:
                age.add_metric(self._gpu_labels(r.info), a)
        errors = CounterMetricFamily(
            "gpushare_exporter_sampler_errors",
            "Failed GPU readings in the background sampler.",
            labels=["node", "simulated"],
        )
        errors.add_metric(node, float(self.sampler.errors))
        cpu = CounterMetricFamily(
            "gpushare_exporter_sampler_cpu_seconds",
            "CPU time the background sampler thread used.",
            labels=["node", "simulated"],
        )
        cpu.add_metric(node, self.sampler.cpu_seconds)
        source = CounterMetricFamily(
            "gpushare_exporter_source_errors",
            "Scrapes where the pod view, MPS status or kubelet pod resources could not be read.",
            labels=["node", "simulated"],
        )
        source.add_metric(node, float(self._source_errors))
        interval = GaugeMetricFamily(
            "gpushare_exporter_sample_interval_seconds",
            "Configured gap between two readings of a GPU.",
            labels=["node", "simulated"],
        )
        interval.add_metric(node, self.sampler.settings.interval_s)
        yield from (age, errors, cpu, source, interval)


def _scalar_values(sample: GpuSample | None) -> dict[str, float | int | None]:
    """A GPU's scalar counters by series name; None for each without a reading."""
    if sample is None:
        return {
            "gpushare_gpu_sm_utilization_ratio": None,
            "gpushare_gpu_sm_occupancy_ratio": None,
            "gpushare_gpu_dram_bandwidth_utilization_ratio": None,
            "gpushare_gpu_utilization_ratio": None,
            "gpushare_gpu_memory_used_bytes": None,
        }
    return {
        "gpushare_gpu_sm_utilization_ratio": sample.sm_utilization_ratio,
        "gpushare_gpu_sm_occupancy_ratio": sample.sm_occupancy_ratio,
        "gpushare_gpu_dram_bandwidth_utilization_ratio": sample.dram_bandwidth_ratio,
        "gpushare_gpu_utilization_ratio": sample.utilization_ratio,
        "gpushare_gpu_memory_used_bytes": sample.memory_used_bytes,
    }


@dataclass(frozen=True)
class _GpuFamilies:
    """The per-GPU metric families of one scrape, filled GPU by GPU."""

    info: GaugeMetricFamily
    pipe: GaugeMetricFamily
    scalars: dict[str, GaugeMetricFamily]
    mem_used: GaugeMetricFamily
    mem_total: GaugeMetricFamily
    available: GaugeMetricFamily

    @classmethod
    def new(cls) -> "_GpuFamilies":
        """Empty families, named and described as exported."""
        return cls(
            info=GaugeMetricFamily(
                "gpushare_gpu_info",
                "A GPU of this node (value 1); backend is nvml or simulated.",
                labels=[*GPU_LABELS, "compute_capability", "memory_bytes", "backend"],
            ),
            pipe=GaugeMetricFamily(
                "gpushare_gpu_pipe_utilization_ratio",
                "Share of time the SMs issued work to this pipe (NVML GPM, Hopper and newer).",
                labels=[*GPU_LABELS, "pipe"],
            ),
            scalars={
                "gpushare_gpu_sm_utilization_ratio": GaugeMetricFamily(
                    "gpushare_gpu_sm_utilization_ratio",
                    "Share of SMs that were busy (NVML GPM).",
                    labels=GPU_LABELS,
                ),
                "gpushare_gpu_sm_occupancy_ratio": GaugeMetricFamily(
                    "gpushare_gpu_sm_occupancy_ratio",
                    "Active warps over the theoretical maximum (NVML GPM).",
                    labels=GPU_LABELS,
                ),
                "gpushare_gpu_dram_bandwidth_utilization_ratio": GaugeMetricFamily(
                    "gpushare_gpu_dram_bandwidth_utilization_ratio",
                    "DRAM bandwidth used over the peak (NVML GPM).",
                    labels=GPU_LABELS,
                ),
                "gpushare_gpu_utilization_ratio": GaugeMetricFamily(
                    "gpushare_gpu_utilization_ratio",
                    "NVML's coarse GPU utilization: share of time any kernel ran.",
                    labels=GPU_LABELS,
                ),
            },
            mem_used=GaugeMetricFamily(
                "gpushare_gpu_memory_used_bytes", "GPU memory in use.", labels=GPU_LABELS
            ),
            mem_total=GaugeMetricFamily(
                "gpushare_gpu_memory_total_bytes", "GPU memory installed.", labels=GPU_LABELS
            ),
            available=GaugeMetricFamily(
                "gpushare_gpu_metric_available",
                "1 when the named series is exported for this GPU, 0 when it is unavailable "
                "(no GPM before Hopper, or no fresh reading); unavailable series are omitted, "
                "never reported as 0.",
                labels=[*GPU_LABELS, "metric", "pipe"],
            ),
        )

    def all(self) -> Iterator[Metric]:
        """The families in the order they have always been exported."""
        yield self.info
        yield self.pipe
        yield from self.scalars.values()
        yield self.mem_used
        yield self.mem_total
        yield self.available
