"""A simulated GPU backend for machines without NVIDIA GPUs (CI, laptops, kind clusters).

It says so: it logs a WARNING when created, marks every GPU ``simulated=True`` in the
inventory (the node agent turns that into the ``gpushare.io/simulated=true`` label) and has
``simulated`` set, which the exporter puts on every series. Counters are not invented: they
are whatever the node agent last passed to :meth:`SimulatedBackend.set_load` (derived from the
placements on that GPU, see ``gpushare.node.simload``), or idle.
"""

import logging
import queue
import re
import threading
import time
import uuid as uuidlib
from dataclasses import dataclass

from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo
from gpushare.api.profile import PIPES
from gpushare.node.gpu.backend import GpuProcess, GpuSample, HealthEvent

log = logging.getLogger(__name__)

GiB = 2**30
MiB = 2**20

# A fixed namespace so the same node name always yields the same fake UUIDs.
_UUID_NAMESPACE = uuidlib.UUID("5f1d7a52-8b8e-4c55-9a0c-6a1d2f7e0c11")


@dataclass(frozen=True)
class SimulatedModel:
    """What a real GPU of this model reports, so simulated inventories look like real ones."""

    name: str
    memory_bytes: int
    sm_count: int
    compute_capability: str


# Keys are what users write in ``--backend simulated:<count>x<KEY>``.
MODELS: dict[str, SimulatedModel] = {
    "H100-80GB": SimulatedModel("NVIDIA H100 80GB HBM3", 81559 * MiB, 132, "9.0"),
    "H200": SimulatedModel("NVIDIA H200", 143771 * MiB, 132, "9.0"),
    "H200-141GB": SimulatedModel("NVIDIA H200", 143771 * MiB, 132, "9.0"),
    "A100-40GB": SimulatedModel("NVIDIA A100-SXM4-40GB", 40960 * MiB, 108, "8.0"),
    "A100-80GB": SimulatedModel("NVIDIA A100-SXM4-80GB", 81920 * MiB, 108, "8.0"),
    "L4": SimulatedModel("NVIDIA L4", 23034 * MiB, 58, "8.9"),
    "T4": SimulatedModel("Tesla T4", 15360 * MiB, 40, "7.5"),
    "V100-32GB": SimulatedModel("Tesla V100-SXM2-32GB", 32768 * MiB, 80, "7.0"),
}

_PART = re.compile(r"^(?:(\d+)x)?([A-Za-z0-9-]+?)(\+mig)?$")
_SPEC_FIELD = "--backend simulated:<spec>"
_SPEC_FIX = (
    'write "<count>x<model>", several joined by commas, e.g. "2xH100-80GB" or '
    '"1xH100-80GB,2xL4"; "+mig" after a model simulates GPUs with MIG enabled, e.g. '
    f'"1xA100-80GB+mig"; models: {", ".join(sorted(MODELS))}'
)


def parse_spec(spec: str) -> list[SimulatedModel]:
    """``"2xH100-80GB,1xL4"`` -> one SimulatedModel per GPU, in index order."""
    return [model for model, _ in parse_spec_mig(spec)]


def parse_spec_mig(spec: str) -> list[tuple[SimulatedModel, bool]]:
    """Like parse_spec, with each GPU's simulated MIG mode (``+mig`` after the model)."""
    gpus: list[tuple[SimulatedModel, bool]] = []
    for raw in spec.split(","):
        part = raw.strip()
        match = _PART.match(part)
        if not match:
            raise InvalidInputError(_SPEC_FIELD, f"{part!r} is not <count>x<model>", _SPEC_FIX)
        count = int(match.group(1) or "1")
        key = match.group(2)
        model = MODELS.get(key) or MODELS.get(key.upper())
        if model is None:
            raise InvalidInputError(_SPEC_FIELD, f"unknown GPU model {key!r}", _SPEC_FIX)
        if not 1 <= count <= 16:
            raise InvalidInputError(_SPEC_FIELD, f"count {count} is outside 1..16", _SPEC_FIX)
        gpus.extend([(model, bool(match.group(3)))] * count)
    if not gpus:
        raise InvalidInputError(_SPEC_FIELD, "names no GPU", _SPEC_FIX)
    return gpus


def simulated_uuid(node_name: str, index: int) -> str:
    """Deterministic fake UUID in NVIDIA's format; stable across restarts of the same node."""
    return f"GPU-{uuidlib.uuid5(_UUID_NAMESPACE, f'{node_name}/{index}')}"


@dataclass
class _Load:
    pipes: dict[str, float]
    sm_occupancy: float
    memory_used_bytes: int


class SimulatedBackend:
    """GpuBackend over fake GPUs. Thread-safe: the agent, exporter and device plugin share it."""

    def __init__(self, spec: str, *, node_name: str) -> None:
        parsed = parse_spec_mig(spec)
        models = [m for m, _ in parsed]
        self._gpus = [
            GpuInfo(
                uuid=simulated_uuid(node_name, i),
                index=i,
                model=m.name,
                memory_bytes=m.memory_bytes,
                sm_count=m.sm_count,
                compute_capability=m.compute_capability,
                healthy=True,
                mps_ready=False,
                simulated=True,
            )
            for i, m in enumerate(models)
        ]
        self._by_uuid = {g.uuid: g for g in self._gpus}
        self._mig = {g.uuid for g, (_, mig) in zip(self._gpus, parsed, strict=True) if mig}
        self._lock = threading.Lock()
        self._loads: dict[str, _Load] = {}
        self._events: queue.Queue[HealthEvent] = queue.Queue()
        self.spec = spec
        log.warning(
            "SIMULATED GPU backend: %d fake GPU(s) (%s) on node %s; no real GPU, MPS daemon or "
            "NVML is used, and every label, annotation and metric says simulated",
            len(self._gpus),
            spec,
            node_name,
        )

    @property
    def name(self) -> str:
        return "simulated"

    @property
    def simulated(self) -> bool:
        return True

    def inventory(self) -> list[GpuInfo]:
        return list(self._gpus)

    def mig_enabled(self, uuid: str) -> bool:
        """Simulated MIG mode (``+mig`` in the spec): lets tests see MIG GPUs skipped."""
        return uuid in self._mig

    def _require(self, uuid: str) -> GpuInfo:
        gpu = self._by_uuid.get(uuid)
        if gpu is None:
            raise KeyError(f"no simulated GPU {uuid}")
        return gpu

    def processes(self, uuid: str) -> list[GpuProcess]:
        """No process ever holds a fake GPU; per-pod memory comes from set_load's total."""
        self._require(uuid)
        return []

    def set_load(
        self,
        uuid: str,
        *,
        pipes: dict[str, float],
        sm_occupancy: float,
        memory_used_bytes: int,
    ) -> None:
        """Set what sample() reports for this GPU until the next call (values are clamped)."""
        gpu = self._require(uuid)
        unknown = set(pipes) - set(PIPES)
        if unknown:
            raise ValueError(f"unknown pipe(s) {sorted(unknown)}; pipes are {PIPES}")
        clamped = {p: min(1.0, max(0.0, float(v))) for p, v in pipes.items()}
        with self._lock:
            self._loads[uuid] = _Load(
                pipes=clamped,
                sm_occupancy=min(1.0, max(0.0, sm_occupancy)),
                memory_used_bytes=min(gpu.memory_bytes, max(0, memory_used_bytes)),
            )

    def sample(self, uuid: str) -> GpuSample:
        gpu = self._require(uuid)
        with self._lock:
            load = self._loads.get(uuid)
        if load is None:
            load = _Load(pipes={}, sm_occupancy=0.0, memory_used_bytes=0)
        pipes: dict[str, float | None] = {p: load.pipes.get(p, 0.0) for p in PIPES}
        busiest = max((v for v in load.pipes.values()), default=0.0)
        return GpuSample(
            uuid=uuid,
            timestamp=time.time(),
            # NVML's coarse utilization reads high whenever any kernel runs; mimic that.
            utilization_ratio=min(1.0, busiest * 1.5),
            memory_used_bytes=load.memory_used_bytes,
            memory_total_bytes=gpu.memory_bytes,
            pipes=pipes,
            sm_utilization_ratio=min(1.0, busiest * 1.2),
            sm_occupancy_ratio=load.sm_occupancy,
            dram_bandwidth_ratio=min(1.0, 0.5 * busiest),
        )

    def inject_health(
        self, uuid: str, *, healthy: bool, reason: str, xid: int | None = None
    ) -> None:
        """Queue a health change as if NVML had reported it (XID, ECC), for tests and demos."""
        self._require(uuid)
        self._events.put(HealthEvent(uuid=uuid, healthy=healthy, reason=reason, xid=xid))

    def wait_health_events(self, timeout_s: float) -> list[HealthEvent]:
        try:
            first = self._events.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return []
        events = [first]
        while True:
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                return events

    def close(self) -> None:
        return None
