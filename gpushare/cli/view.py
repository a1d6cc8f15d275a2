"""The data behind ``kubectl gpushare top``: nodes, their GPUs and the pods placed on each,
plus live readings. Built from plain dicts so it renders the same from any source."""

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo, load_inventory
from gpushare.api.names import ANN_CLASS, ANN_FRACTION, ANN_NODE_GPUS, ANN_STATE, CLASS_BATCH
from gpushare.api.placement import parse_placement
from gpushare.api.quantities import parse_fraction
from gpushare.api.selector import Requirement, matches

PIPE_ORDER = ("fp16", "fp32", "fp64", "tensor", "tensor_hmma", "tensor_dmma", "tensor_imma")


@dataclass
class PodRow:
    namespace: str
    name: str
    gpu_class: str
    fraction_percent: int | None
    """Guaranteed share (request) in GPU-percent: the pod's annotation, else what the scheduler
    recorded at bind (a GpuShare's pods); None when neither says."""
    thread_percent: int
    """The pod's limit: the MPS active-thread cap its processes run with."""
    memory_limit_bytes: int
    state: str
    phase: str
    memory_used_bytes: float | None = None


@dataclass
class GpuRow:
    info: GpuInfo
    pods: list[PodRow] = field(default_factory=list)
    pipes: dict[str, float] = field(default_factory=dict)
    utilization: float | None = None
    sm_occupancy: float | None = None
    dram_bandwidth: float | None = None
    memory_used_bytes: float | None = None
    mps_clients: float | None = None
    simulated: bool = False

    @property
    def limit_percent(self) -> int:
        """Sum of the pods' thread caps (limits); above ``allocated_percent`` when pods may use
        room their neighbours leave."""
        return sum(p.thread_percent for p in self.pods)

    @property
    def allocated_percent(self) -> int:
        return sum(
            p.fraction_percent if p.fraction_percent is not None else p.thread_percent
            for p in self.pods
        )


@dataclass
class NodeRow:
    name: str
    gpus: list[GpuRow]
    problem: str | None = None


@dataclass
class Live:
    """Readings keyed by GPU UUID (and pod for memory) from exporters or Prometheus."""

    pipes: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    scalars: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    pod_memory: dict[tuple[str, str, str], float] = field(default_factory=dict)
    source: str = ""

    def add(self, name: str, labels: Mapping[str, str], value: float) -> None:
        uuid = labels.get("gpu_uuid", "")
        if name == "gpushare_gpu_pipe_utilization_ratio":
            self.pipes[uuid][labels.get("pipe", "")] = value
        elif name == "gpushare_pod_gpu_memory_used_bytes":
            key = (labels.get("namespace", ""), labels.get("pod", ""), uuid)
            self.pod_memory[key] = self.pod_memory.get(key, 0.0) + value
        elif name == "gpushare_gpu_info":
            self.scalars[uuid]["simulated"] = float(labels.get("simulated") == "true")
        else:
            self.scalars[uuid][name] = value


LIVE_METRICS = (
    "gpushare_gpu_pipe_utilization_ratio",
    "gpushare_gpu_utilization_ratio",
    "gpushare_gpu_sm_occupancy_ratio",
    "gpushare_gpu_dram_bandwidth_utilization_ratio",
    "gpushare_gpu_memory_used_bytes",
    "gpushare_mps_clients",
    "gpushare_pod_gpu_memory_used_bytes",
    "gpushare_gpu_info",
)


def _pod_row(pod: Mapping[str, Any]) -> tuple[PodRow, tuple[str, ...]] | None:
    meta = pod.get("metadata") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    try:
        placement = parse_placement(annotations)
    except InvalidInputError:
        return None
    if placement is None:
        return None
    phase = str((pod.get("status") or {}).get("phase", ""))
    if phase in ("Succeeded", "Failed"):
        return None
    fraction: int | None = placement.request_percent
    raw = annotations.get(ANN_FRACTION)
    if raw is not None:
        try:
            fraction = min(parse_fraction(raw, field=ANN_FRACTION), 100)
        except InvalidInputError:
            fraction = placement.request_percent
    row = PodRow(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        gpu_class=annotations.get(ANN_CLASS, CLASS_BATCH) or CLASS_BATCH,
        fraction_percent=fraction,
        thread_percent=placement.thread_percent,
        memory_limit_bytes=placement.memory_limit_bytes,
        state=annotations.get(ANN_STATE, placement.state),
        phase=phase,
    )
    return row, placement.gpu_uuids


def build_view(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    live: Live | None = None,
    node_filter: str | None = None,
    namespace: str | None = None,
    pod_selector: tuple[Requirement, ...] = (),
    node_selector: tuple[Requirement, ...] = (),
) -> list[NodeRow]:
    """Join nodes' GPU inventories with the pods placed on them (and live readings if any).
    ``namespace`` None and empty selectors keep every pod and node."""
    by_node_gpu: dict[tuple[str, str], list[PodRow]] = defaultdict(list)
    for pod in pods:
        if not matches(pod_selector, (pod.get("metadata") or {}).get("labels")):
            continue
        found = _pod_row(pod)
        if found is None:
            continue
        pod_row, uuids = found
        if namespace is not None and pod_row.namespace != namespace:
            continue
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        for uuid in uuids:
            by_node_gpu[(node, uuid)].append(replace(pod_row))
    result: list[NodeRow] = []
    for node_obj in sorted(nodes, key=lambda n: str((n.get("metadata") or {}).get("name", ""))):
        meta = node_obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        if node_filter is not None and name != node_filter:
            continue
        if not matches(node_selector, meta.get("labels")):
            continue
        text = (meta.get("annotations") or {}).get(ANN_NODE_GPUS)
        if text is None:
            if node_filter is not None:
                result.append(NodeRow(name, [], problem=f"no {ANN_NODE_GPUS} annotation"))
            continue
        try:
            inventory = load_inventory(text)
        except InvalidInputError as exc:
            result.append(NodeRow(name, [], problem=str(exc)))
            continue
        gpus = []
        for info in inventory:
            row = GpuRow(info=info, pods=by_node_gpu.get((name, info.uuid), []))
            row.simulated = info.simulated
            if live is not None:
                _apply_live(row, live)
            row.pods.sort(key=lambda p: (p.namespace, p.name))
            gpus.append(row)
        result.append(NodeRow(name, gpus))
    return result


def _apply_live(row: GpuRow, live: Live) -> None:
    uuid = row.info.uuid
    row.pipes = dict(live.pipes.get(uuid, {}))
    scalars = live.scalars.get(uuid, {})
    row.utilization = scalars.get("gpushare_gpu_utilization_ratio")
    row.sm_occupancy = scalars.get("gpushare_gpu_sm_occupancy_ratio")
    row.dram_bandwidth = scalars.get("gpushare_gpu_dram_bandwidth_utilization_ratio")
    row.memory_used_bytes = scalars.get("gpushare_gpu_memory_used_bytes")
    row.mps_clients = scalars.get("gpushare_mps_clients")
    if scalars.get("simulated"):
        row.simulated = True
    for pod in row.pods:
        pod.memory_used_bytes = live.pod_memory.get((pod.namespace, pod.name, uuid))
