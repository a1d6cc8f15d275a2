"""The data behind ``kubectl gpushare top``: nodes, their GPUs and the pods placed on each,
plus live readings. Built from plain dicts so it renders the same from any source.

Both modes show: a device-plugin node's GPUs come from its ``gpushare.io/gpus`` annotation and
its pods from their placement annotations; a DRA-mode node's GPUs come from its ResourceSlice
and its pods from the allocated claims reserved for them (request = the claim's
``gpuPercent``, limit = its MpsConfig ``limit``, 100 without one, state ``claim``;
docs/cli.md)."""

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict

from gpushare.api.dra_objects import DraGpu, read_allocation, read_slice, reserved_pods
from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo, load_inventory
from gpushare.api.names import (
    ANN_CLASS,
    ANN_FRACTION,
    ANN_NODE_GPUS,
    ANN_PAUSE,
    ANN_PAUSED,
    ANN_STATE,
    CLASS_BATCH,
    SLICES_PER_GPU,
    TIER_GUARANTEED,
)
from gpushare.api.pause import load_pause_request
from gpushare.api.pod import pod_info
from gpushare.api.profile import PIPES
from gpushare.api.quantities import parse_fraction
from gpushare.api.selector import Requirement, matches

PIPE_ORDER = tuple(p for p in PIPES if p != "integer")
"""The pipes ``top`` shows, in the order of record (integer work is left out)."""


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
    tier: str = TIER_GUARANTEED
    """``opportunistic``: running beyond its GPU's guaranteed capacity, preemptible, until
    promoted (docs/packing.md, "The sharing contract")."""
    paused: str = "-"
    """``yes`` (its containers frozen), ``asked`` (gpushare asked, the node agent has not
    frozen it yet), ``resuming`` (the request withdrawn, still frozen), ``-`` (running)."""
    pause_reason: str = ""
    """The pause request's reason (``guaranteed-needs-room`` | ``harm``), ``malformed`` for one
    the node agent cannot read (it keeps the pod running)."""
    pause_message: str = ""
    """The pause request's message: who needs the room, or what harm was measured."""


class PauseFields(TypedDict, total=False):
    paused: str
    pause_reason: str
    pause_message: str


def pause_columns(annotations: Mapping[str, str]) -> PauseFields:
    """A pod's PodRow pause fields, from the controller's request (``gpushare.io/pause``) and
    the node agent's record of the freeze (``gpushare.io/paused``; docs/node-agent.md)."""
    asked, frozen = annotations.get(ANN_PAUSE), ANN_PAUSED in annotations
    if asked is None:
        return {"paused": "resuming" if frozen else "-"}
    try:
        request = load_pause_request(asked)
    except InvalidInputError:
        return {"paused": "resuming" if frozen else "-", "pause_reason": "malformed"}
    return {
        "paused": "yes" if frozen else "asked",
        "pause_reason": request.reason,
        "pause_message": request.message,
    }


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
    """The row of a pod placed by its annotations (read as the node agent reads a pod), None
    for one with no placement or an unreadable one."""
    info = pod_info(pod)
    placement, annotations = info.placement, info.annotations
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
        namespace=info.namespace,
        name=info.name,
        gpu_class=annotations.get(ANN_CLASS, CLASS_BATCH) or CLASS_BATCH,
        fraction_percent=fraction,
        thread_percent=placement.thread_percent,
        memory_limit_bytes=placement.memory_limit_bytes,
        state=annotations.get(ANN_STATE, placement.state),
        phase=phase,
        tier=placement.tier,
        **pause_columns(annotations),
    )
    return row, placement.gpu_uuids


CLAIM_STATE = "claim"
"""The state column of a pod holding a DRA claim (its share is the claim's allocation)."""


def _dra_gpus(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], DraGpu]:
    """(pool, device) -> GPU of every readable slice of gpushare's driver."""
    out: dict[tuple[str, str], DraGpu] = {}
    for obj in slices:
        try:
            gpus = read_slice(obj)
        except InvalidInputError:
            continue
        for gpu in gpus or ():
            out[(gpu.pool, gpu.device)] = gpu
    return out


def _claim_rows(
    claims: Iterable[Mapping[str, Any]],
    gpus: Mapping[tuple[str, str], DraGpu],
    pods: Mapping[tuple[str, str], Mapping[str, Any]],
) -> list[tuple[Mapping[str, Any], PodRow, DraGpu]]:
    """(pod, its row, the GPU) for every pod an allocated claim on our GPUs is reserved for."""
    out: list[tuple[Mapping[str, Any], PodRow, DraGpu]] = []
    for claim in claims:
        try:
            shares = read_allocation(claim)
        except InvalidInputError:
            continue
        users = [name for name, _ in reserved_pods(claim)]
        for share in shares:
            gpu = gpus.get((share.pool, share.device))
            if gpu is None:
                continue
            for name in users:
                pod = pods.get((share.namespace, name))
                if pod is None:
                    continue
                phase = str((pod.get("status") or {}).get("phase", ""))
                if phase in ("Succeeded", "Failed"):
                    continue
                row = PodRow(
                    namespace=share.namespace,
                    name=name,
                    gpu_class=share.gpu_class,
                    fraction_percent=share.percent,
                    thread_percent=share.limit if share.limit is not None else SLICES_PER_GPU,
                    memory_limit_bytes=share.memory_bytes
                    or gpu.memory_bytes * share.percent // SLICES_PER_GPU,
                    state=CLAIM_STATE,
                    phase=phase,
                    **pause_columns((pod.get("metadata") or {}).get("annotations") or {}),
                )
                out.append((pod, row, gpu))
    return out


def _gpu_info(gpu: DraGpu) -> GpuInfo:
    return GpuInfo(
        uuid=gpu.uuid,
        index=gpu.index,
        model=gpu.model,
        memory_bytes=gpu.memory_bytes,
        sm_count=0,
        compute_capability="",
        mps_ready=True,
    )


def build_view(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    slices: Iterable[Mapping[str, Any]] = (),
    claims: Iterable[Mapping[str, Any]] = (),
    live: Live | None = None,
    node_filter: str | None = None,
    namespace: str | None = None,
    pod_selector: tuple[Requirement, ...] = (),
    node_selector: tuple[Requirement, ...] = (),
) -> list[NodeRow]:
    """Join nodes' GPU inventories with the pods placed on them (and live readings if any);
    DRA-mode nodes' GPUs from ``slices``, their pods from ``claims``. ``namespace`` None and
    empty selectors keep every pod and node."""
    dra_gpus = _dra_gpus(slices)
    by_node_gpu = _pods_by_gpu(
        list(pods), claims, dra_gpus, namespace=namespace, pod_selector=pod_selector
    )
    dra_nodes: dict[str, list[DraGpu]] = defaultdict(list)
    for gpu in dra_gpus.values():
        dra_nodes[gpu.node].append(gpu)
    result: list[NodeRow] = []
    for node_obj in sorted(nodes, key=lambda n: str((n.get("metadata") or {}).get("name", ""))):
        meta = node_obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        if node_filter is not None and name != node_filter:
            continue
        if not matches(node_selector, meta.get("labels")):
            continue
        claimed = sorted(dra_nodes.get(name, ()), key=lambda g: g.index)
        row = _node_row(name, meta, claimed, by_node_gpu, live, asked=node_filter is not None)
        if row is not None:
            result.append(row)
    return result


def _pods_by_gpu(
    pods: list[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
    dra_gpus: Mapping[tuple[str, str], DraGpu],
    *,
    namespace: str | None,
    pod_selector: tuple[Requirement, ...],
) -> dict[tuple[str, str], list[PodRow]]:
    """(node, GPU UUID) -> the pods on that GPU that the namespace and selector keep: DRA-mode
    pods from their claims, device-plugin-mode pods from their placement annotations."""
    by_node_gpu: dict[tuple[str, str], list[PodRow]] = defaultdict(list)
    by_name = {
        (
            str((p.get("metadata") or {}).get("namespace", "")),
            str((p.get("metadata") or {}).get("name", "")),
        ): p
        for p in pods
    }
    for pod, pod_row, gpu in _claim_rows(claims, dra_gpus, by_name):
        if namespace is not None and pod_row.namespace != namespace:
            continue
        if not matches(pod_selector, (pod.get("metadata") or {}).get("labels")):
            continue
        by_node_gpu[(gpu.node, gpu.uuid)].append(pod_row)
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
    return by_node_gpu


def _node_row(
    name: str,
    meta: Mapping[str, Any],
    claimed: list[DraGpu],
    by_node_gpu: Mapping[tuple[str, str], list[PodRow]],
    live: Live | None,
    *,
    asked: bool,
) -> NodeRow | None:
    """One node's row: its GPUs (inventory annotation, then ResourceSlice GPUs) with their
    pods; a row naming the problem when its inventory is unreadable, or when it has none and
    was ``asked`` for by name; None for a node without gpushare GPUs."""
    text = (meta.get("annotations") or {}).get(ANN_NODE_GPUS)
    if text is None and not claimed:
        if not asked:
            return None
        return NodeRow(
            name, [], problem=f"no {ANN_NODE_GPUS} annotation and no gpushare ResourceSlice"
        )
    try:
        inventory = load_inventory(text) if text is not None else []
    except InvalidInputError as exc:
        return NodeRow(name, [], problem=str(exc))
    gpus = []
    for info in [*inventory, *(_gpu_info(g) for g in claimed)]:
        row = GpuRow(info=info, pods=list(by_node_gpu.get((name, info.uuid), [])))
        row.simulated = info.simulated
        if live is not None:
            _apply_live(row, live)
        row.pods.sort(key=lambda p: (p.namespace, p.name))
        gpus.append(row)
    return NodeRow(name, gpus)


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
