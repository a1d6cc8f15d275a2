"""The controller's placement path per pod, in one process, as the scale bench drives it.

``bench/scale`` measures the extender through the real kube-scheduler, API server and KWOK on
a machine they share (docs/scale.md). This takes them away and keeps what the controller does
for each pod of the extender phase, with its product defaults (gpushare policy, interference
admission, filter-time holds, opportunism):

1. the pod watch's ADDED event (``ClusterView.upsert_pod``, the pod as the webhook left it);
2. ``POST /scheduler/filter`` over real HTTP to the controller's aiohttp app, with the nodes
   kube-scheduler's ``numFeasibleNodesToFind`` window sends (about 420 of 1,000 nodes, 500 of
   5,000; :class:`bench.sim.stock.NodeWindow`, its own CPU, memory and node-total GPU-share
   filter applied, as the chart configures it);
3. ``POST /scheduler/bind`` to the node filter held (the Binding write is a no-op that
   records the placement annotations);
4. the watch's MODIFIED events the Binding and KWOK cause: bound with the annotations, then
   Running (the pod's Allocate done, so later binds do not wait at the gate).

Nodes are the scale bench's 8-GPU KWOK nodes (:mod:`bench.scale.workload`), filled beforehand
with bound tenants of the same trace; pods are the openb trace's fractional tasks in trace
order (synthetic ones of the same kind when the trace is absent). Phases: ``steady`` (every
cache live) and ``cold`` (the extender's and the placer's remembered answers emptied before
each pod: the cost of a pod shape never met). Times are client-side per call (HTTP and JSON
included) and, inside the controller, per verb and per watch event.
"""

import copy
import random
import statistics
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import ClientSession

from bench.scale.workload import (
    NodeShape,
    TracePod,
    fractional_pod,
    node_inventory,
    node_manifest,
    read_trace,
    take,
)
from bench.sim.stock import NodeWindow
from gpushare.api.names import (
    ANN_GPU_UUID,
    ANN_MEMORY_LIMIT,
    ANN_REQUEST_PERCENT,
    ANN_THREAD_PERCENT,
    ANN_TIER,
    STATE_ALLOCATED,
)
from gpushare.api.placement import Placement
from gpushare.cluster.extender.args import BindingArgs, ExtenderArgs
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.metrics import Metrics
from gpushare.cluster.server import Listener, extender_routes
from gpushare.cluster.state.view import ClusterView
from gpushare.packing.admission import Admission
from gpushare.packing.opportunistic import Opportunism
from gpushare.packing.policy import Policy

NAMESPACE = "bench"
DECIDED = (ANN_GPU_UUID, ANN_THREAD_PERCENT, ANN_MEMORY_LIMIT, ANN_REQUEST_PERCENT, ANN_TIER)
"""What a decision is, of the placement a bind writes (its time aside)."""
MIB = 1 << 20


class Writer:
    """The API calls bind makes, answered in memory: the Binding's annotations are kept for
    the watch events the bench then feeds the view."""

    def __init__(self) -> None:
        self.bound: dict[str, tuple[str, dict[str, str]]] = {}
        self.docs: dict[str, dict[str, Any]] = {}

    async def get_pod(self, *, namespace: str, name: str) -> dict[str, Any]:
        return self.docs[f"{namespace}/{name}"]

    async def bind_pod(
        self,
        *,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        annotations: dict[str, str] | None = None,
    ) -> None:
        self.bound[f"{namespace}/{name}"] = (node, dict(annotations or {}))


def synthetic_tasks(count: int, seed: int) -> list[TracePod]:
    """Fractional tasks shaped like the openb trace's (shares 5-99 %, a third at 81 %, CPU and
    memory requests of a few shapes) for when the trace is not at hand."""
    rng = random.Random(seed)
    tasks = []
    for i in range(count):
        milli = 810 if rng.random() < 0.35 else rng.choice((50, 100, 200, 250, 300, 500, 700))
        tasks.append(
            TracePod(
                name=f"synthetic-{i:05d}",
                cpu_milli=rng.choice((1000, 2000, 4000, 6000, 8000, 12000)),
                memory_mib=rng.choice((2048, 4096, 8192, 16384, 30720)),
                gpu_milli=milli,
                qos=rng.choice(("LS", "LS", "BE")),
                creation_time=i,
            )
        )
    return tasks


def tasks(traces: Path | None, count: int, seed: int) -> tuple[list[TracePod], str]:
    """``count`` fractional tasks in trace order, and where they came from."""
    if traces is not None and (traces / "openb_pod_list_default.csv").is_file():
        return take(read_trace(traces), count, fractional=True), "openb_pod_list_default.csv"
    return synthetic_tasks(count, seed), "synthetic"


def _stamp(doc: dict[str, Any], uid: str) -> dict[str, Any]:
    doc["metadata"]["uid"] = uid
    doc["metadata"]["creationTimestamp"] = "2026-11-25T00:00:00Z"
    doc["metadata"]["resourceVersion"] = "1"
    return doc


def prefilled_cluster(
    nodes: int, gpus_per_node: int, fill: float, pool: list[TracePod], rng: random.Random
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The scale bench's nodes, each GPU holding tenants of the trace (drawn in turn from
    ``pool``) while they fit and a draw under ``fill`` says go on: bound, Running, allocated."""
    shape = NodeShape(gpus=gpus_per_node)
    node_docs = [node_manifest(i, shape) for i in range(nodes)]
    pod_docs: list[dict[str, Any]] = []
    now = datetime.now(UTC)
    k = 0
    for node in node_docs:
        name = node["metadata"]["name"]
        cpu = shape.cpu_milli
        memory = shape.memory_mib
        for gpu in node_inventory(name, shape):
            uuid = gpu.uuid
            used = 0
            while rng.random() < fill:
                task = pool[k % len(pool)]
                if used + task.percent > 100 or task.cpu_milli > cpu or task.memory_mib > memory:
                    break
                k += 1
                used += task.percent
                cpu -= task.cpu_milli
                memory -= task.memory_mib
                doc = _stamp(
                    fractional_pod(k, task, namespace=NAMESPACE, phase="tenant"), f"uid-t{k}"
                )
                placement = Placement(
                    (uuid,),
                    task.percent,
                    shape.gpu_memory_bytes * task.percent // 100,
                    now,
                    STATE_ALLOCATED,
                    request_percent=task.percent,
                )
                doc["metadata"]["annotations"].update(placement.to_annotations())
                doc["spec"]["nodeName"] = name
                doc["status"] = {"phase": "Running"}
                pod_docs.append(doc)
    return node_docs, pod_docs


@dataclass
class PodTiming:
    filter_ms: float
    bind_ms: float | None
    filter_inside_ms: float
    bind_inside_ms: float | None
    watch_ms: float
    """The three watch events' time in the view (ADDED, bound, Running)."""
    cpu_ms: float
    offered: int
    node: str


@dataclass
class Flow:
    """The controller under test and what the bench keeps beside it."""

    view: ClusterView
    extender: Extender
    writer: Writer
    names: list[str]
    window: NodeWindow
    inside: dict[str, list[float]] = field(default_factory=lambda: {"filter": [], "bind": []})
    counts_share: bool = True
    """kube-scheduler's own fit counts each node's gpushare.io/gpu-percent (the chart since
    2026-11-28); False: it ignores the share (``ignoredResources``, the chart before)."""


def build(
    nodes: int,
    gpus_per_node: int,
    fill: float,
    pool: list[TracePod],
    seed: int,
    *,
    policy: str = "gpushare",
    nodes_percent: int | None = None,
    counts_share: bool = True,
) -> Flow:
    """The view filled as :func:`prefilled_cluster` says, and the extender the controller
    builds with its defaults (gpushare.cluster.main._extender)."""
    node_docs, pod_docs = prefilled_cluster(nodes, gpus_per_node, fill, pool, random.Random(seed))
    view = ClusterView()
    view.replace_nodes(node_docs)
    view.replace_pods(pod_docs)
    view.mark_synced()
    writer = Writer()
    extender = Extender(
        view=view,
        writer=writer,
        policy=Policy(policy),
        admission=Admission(),
        hold_in_filter=True,
        opportunism=Opportunism(),
    )
    names = [d["metadata"]["name"] for d in node_docs]
    flow = Flow(
        view,
        extender,
        writer,
        names,
        NodeWindow(len(names), nodes_percent),
        counts_share=counts_share,
    )
    _time_inside(flow)
    return flow


def _time_inside(flow: Flow) -> None:
    """Time each verb inside the controller (no HTTP, no JSON): instance attributes shadow
    the methods the app calls."""
    filter_verb = flow.extender.filter
    bind_verb = flow.extender.bind

    def timed_filter(args: ExtenderArgs) -> dict[str, Any]:
        start = time.perf_counter()
        try:
            return filter_verb(args)
        finally:
            flow.inside["filter"].append((time.perf_counter() - start) * 1e3)

    async def timed_bind(args: BindingArgs) -> dict[str, str]:
        start = time.perf_counter()
        try:
            return await bind_verb(args)
        finally:
            flow.inside["bind"].append((time.perf_counter() - start) * 1e3)

    flow.extender.filter = timed_filter  # type: ignore[method-assign]
    flow.extender.bind = timed_bind  # type: ignore[method-assign]


def forget_answers(extender: Extender) -> None:
    """Every answer the extender and its placer remember, emptied: a pod shape never met."""
    extender.answers.clear()
    extender.shape_costs.clear()
    extender.placer.forget()


async def place(
    session: ClientSession,
    base: str,
    flow: Flow,
    task: TracePod,
    *,
    index: int,
    tag: str,
    cold: bool,
    decisions: list[str] | None = None,
) -> PodTiming:
    """One pod through the controller: watch ADDED, filter, bind, watch bound and Running."""
    view = flow.view
    doc = _stamp(fractional_pod(index, task, namespace=NAMESPACE, phase=tag), f"uid-{tag}{index}")
    doc["status"] = {"phase": "Pending"}
    key = f"{NAMESPACE}/{doc['metadata']['name']}"
    flow.writer.docs[key] = doc
    if cold:
        forget_answers(flow.extender)
    host_free = view.host_free
    node_of = view.node

    def feasible(i: int) -> bool:
        free = host_free(flow.names[i])
        if free is not None and (free[0] < task.cpu_milli or free[1] < task.memory_mib * MIB):
            return False
        if not flow.counts_share:
            return True
        node = node_of(flow.names[i])
        return node is None or task.percent <= sum(g.free_percent for g in node.gpus if g.healthy)

    offered = [flow.names[i] for i in flow.window.candidates(feasible)]
    c0 = time.process_time()
    w0 = time.perf_counter()
    view.upsert_pod(doc)
    watch = time.perf_counter() - w0
    t0 = time.perf_counter()
    async with session.post(
        f"{base}/scheduler/filter", json={"Pod": doc, "NodeNames": offered}
    ) as resp:
        result = await resp.json()
    filter_ms = (time.perf_counter() - t0) * 1e3
    chosen = result.get("NodeNames") or []
    bind_ms: float | None = None
    node = ""
    if chosen:
        node = chosen[0]
        t1 = time.perf_counter()
        async with session.post(
            f"{base}/scheduler/bind",
            json={
                "PodName": doc["metadata"]["name"],
                "PodNamespace": NAMESPACE,
                "PodUID": doc["metadata"]["uid"],
                "Node": node,
            },
        ) as resp:
            answer = await resp.json()
        bind_ms = (time.perf_counter() - t1) * 1e3
        if answer.get("Error"):
            raise RuntimeError(f"bind of {key} to {node} failed: {answer['Error']}")
        bound_node, annotations = flow.writer.bound[key]
        bound = copy.deepcopy(doc)
        bound["metadata"]["annotations"].update(annotations)
        bound["metadata"]["resourceVersion"] = "2"
        bound["spec"]["nodeName"] = bound_node
        bound["status"] = {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
        }
        running = copy.deepcopy(bound)
        running["metadata"]["resourceVersion"] = "3"
        running["status"] = {
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
        }
        w1 = time.perf_counter()
        view.upsert_pod(bound)
        view.upsert_pod(running)
        watch += time.perf_counter() - w1
    else:
        w1 = time.perf_counter()
        view.delete_pod(key)
        watch += time.perf_counter() - w1
    cpu = (time.process_time() - c0) * 1e3
    if decisions is not None:
        written = flow.writer.bound.get(key, ("", {}))[1]
        decisions.append(" ".join([node, *(written.get(k, "-") for k in DECIDED)]) if node else "")
    inside = flow.inside
    return PodTiming(
        filter_ms,
        bind_ms,
        inside["filter"][-1],
        inside["bind"][-1] if chosen else None,
        watch * 1e3,
        cpu,
        len(offered),
        node,
    )


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(samples: list[PodTiming]) -> dict[str, Any]:
    def stats(values: list[float]) -> dict[str, float]:
        return {
            "p50_ms": round(pct(values, 0.5), 3),
            "p99_ms": round(pct(values, 0.99), 3),
            "mean_ms": round(statistics.fmean(values), 3) if values else float("nan"),
        }

    binds = [s.bind_ms for s in samples if s.bind_ms is not None]
    binds_inside = [s.bind_inside_ms for s in samples if s.bind_inside_ms is not None]
    return {
        "pods": len(samples),
        "placed": len(binds),
        "offered_mean": round(statistics.fmean(s.offered for s in samples), 1),
        "filter": stats([s.filter_ms for s in samples]),
        "bind": stats(binds),
        "filter_inside": stats([s.filter_inside_ms for s in samples]),
        "bind_inside": stats(binds_inside),
        "watch_per_pod": stats([s.watch_ms for s in samples]),
        "cpu_per_pod": stats([s.cpu_ms for s in samples]),
    }


async def run(
    flow: Flow,
    stream: list[TracePod],
    *,
    warm: int,
    steady: int,
    cold: int,
    decisions: list[str] | None = None,
) -> dict[str, Any]:
    """Warm-up pods (untimed), then the steady and cold phases, each on the next pods of
    ``stream``; ``decisions`` gets each pod's node and GPUs ("" where no node took it)."""
    routes = extender_routes(
        flow.extender, metrics=Metrics(flow.view), ready=lambda: (True, "bench")
    )
    listener = Listener(routes, host="127.0.0.1", port=0, ssl_context=None)
    await listener.start()
    port = listener.bound_port
    base = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {}
    at = 0
    try:
        async with ClientSession() as session:
            for phase, count, is_cold in (("warm", warm, False), ("steady", steady, False),
                                          ("cold", cold, True)):  # fmt: skip
                samples = []
                for _ in range(count):
                    task = stream[at % len(stream)]
                    samples.append(
                        await place(
                            session,
                            base,
                            flow,
                            task,
                            index=at,
                            tag="p",
                            cold=is_cold,
                            decisions=decisions,
                        )
                    )
                    at += 1
                if phase != "warm" and samples:
                    out[phase] = summary(samples)
    finally:
        await listener.stop()
    return out
