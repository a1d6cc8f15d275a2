"""The extender's filter on an openb cluster, in one process: where its time goes, per call.

The openb replay (``bench/replay``) measures the filter through the real scheduler, on a
machine that also runs the API server, etcd, two schedulers and KWOK. This bench takes those
away: the controller's own :class:`~gpushare.cluster.state.view.ClusterView` and
:class:`~gpushare.cluster.extender.verbs.Extender` (product defaults: gpushare policy, interference
admission, filter-time holds) over the node list's nodes, fed the seed's arrivals the way the
controller's watch and kube-scheduler feed them:

- each pod is shown to the view as created (so the pod mix learns it, as the watch does);
- kube-scheduler's own filters (CPU, memory, allowed GPU models) and its
  ``numFeasibleNodesToFind`` window (:class:`bench.sim.stock.NodeWindow`) choose the nodes sent;
- ``Extender.filter`` is timed (the work between the HTTP body and the answer);
- a pod filter placed is shown to the view bound, with the placement its hold promised, as the
  Binding's watch event does; a pod no node took counts as failed (the replay retries it a few
  times; here it is asked once).

    python -m bench.extender.openb_filter [--trace default] [--seed 42] [--limit N] [--profile]

Prints the filter latency distribution (all calls, and calls that placed vs refused the pod)
and the allocation it reached. Nothing is written unless ``--out`` is given.
"""

import argparse
import cProfile
import gc
import json
import platform
import pstats
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.replay.manifests import node_manifest, pod_manifest
from bench.sim.engine import arrivals
from bench.sim.stock import NodeWindow, chart_nodes_percent
from bench.sim.trace import NodeSpec, PodSpec, load_nodes, load_pods, pod_lists
from gpushare.api.names import SCHEDULER_NAME, SLICES_PER_GPU
from gpushare.api.placement import Placement
from gpushare.cluster.extender.args import ExtenderArgs
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.state.view import ClusterView
from gpushare.packing.admission import Admission

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TRACES = REPO.parent / "shared" / "traces" / "openb"
NAMESPACE = "openb"
MIB = 1 << 20


class HostLedger:
    """CPU and memory bound per node, as kube-scheduler's own NodeResourcesFit counts them."""

    def __init__(self, nodes: list[NodeSpec]) -> None:
        self.cpu = [n.cpu_milli for n in nodes]
        self.memory = [n.memory_mib * MIB for n in nodes]
        self.models = [n.model for n in nodes]

    def passes(self, i: int, pod: PodSpec) -> bool:
        if pod.cpu_milli > self.cpu[i] or pod.memory_mib * MIB > self.memory[i]:
            return False
        return not pod.models or self.models[i] in pod.models

    def take(self, i: int, pod: PodSpec) -> None:
        self.cpu[i] -= pod.cpu_milli
        self.memory[i] -= pod.memory_mib * MIB


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "calls": len(values),
        "mean_ms": round(1000 * statistics.fmean(values), 3) if values else float("nan"),
        "p50_ms": round(1000 * _percentile(values, 0.50), 3),
        "p90_ms": round(1000 * _percentile(values, 0.90), 3),
        "p99_ms": round(1000 * _percentile(values, 0.99), 3),
        "max_ms": round(1000 * max(values), 3) if values else float("nan"),
    }


def run(
    nodes: list[NodeSpec],
    pods: list[PodSpec],
    *,
    seed: int,
    ratio: float,
    limit: int | None,
    chosen_nodes: list[str] | None = None,
    answers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Replay the arrivals through the view and the extender's filter (module doc);
    ``chosen_nodes`` gets the node filter held for each pod ("" where none), in order, and
    ``answers`` each filter answer (with the reasons given for every node where none fits)."""
    view = ClusterView()
    for spec in nodes:
        view.upsert_node(node_manifest(spec))
    extender = Extender(view=view, writer=None, admission=Admission(), hold_in_filter=True)
    names = [n.name for n in nodes]
    index = {name: i for i, name in enumerate(names)}
    ledger = HostLedger(nodes)
    window = NodeWindow(len(nodes), chart_nodes_percent())
    queue = arrivals(pods, SLICES_PER_GPU * sum(n.gpus for n in nodes), ratio, random.Random(seed))
    if limit is not None:
        queue = queue[:limit]
    placed_s: list[float] = []
    refused_s: list[float] = []
    allocated = 0
    for k, spec in enumerate(queue):
        doc = pod_manifest(spec, name=f"p{k:06d}", namespace=NAMESPACE, run="bench")
        doc["metadata"]["uid"] = f"uid-{k}"
        doc["spec"]["schedulerName"] = SCHEDULER_NAME
        doc["status"] = {"phase": "Pending"}
        view.upsert_pod(doc)
        offered = window.candidates(lambda i, p=spec: ledger.passes(i, p))
        args = ExtenderArgs(pod=doc, node_names=[names[i] for i in offered], nodes=None)
        start = time.perf_counter()
        result = extender.filter(args)
        seconds = time.perf_counter() - start
        if answers is not None:
            answers.append(result)
        chosen = result.get("NodeNames") or []
        key = f"{NAMESPACE}/p{k:06d}"
        held = view.reservation(key)
        if chosen_nodes is not None:
            chosen_nodes.append(chosen[0] if chosen else "")
        if not chosen:
            refused_s.append(seconds)
            continue
        placed_s.append(seconds)
        node = chosen[0]
        ledger.take(index[node], spec)
        doc = json.loads(json.dumps(doc))
        doc["spec"]["nodeName"] = node
        doc["status"] = {"phase": "Running"}
        if held is not None and held.assignment.gpu_uuids:
            placement = Placement(
                gpu_uuids=held.assignment.gpu_uuids,
                thread_percent=held.assignment.thread_percent,
                memory_limit_bytes=held.assignment.memory_limit_bytes,
                bind_time=held.bind_time,
                state="allocated",
                request_percent=min(spec.percent, SLICES_PER_GPU),
            )
            doc["metadata"]["annotations"].update(placement.to_annotations())
            allocated += spec.percent * spec.num_gpu
        view.upsert_pod(doc)
        if held is not None:
            view.release(held)
    capacity = SLICES_PER_GPU * sum(n.gpus for n in nodes)
    return {
        "pods": len(queue),
        "placed": len(placed_s),
        "refused": len(refused_s),
        "alloc_percent": round(100.0 * allocated / capacity, 3),
        "filter_all": _summary(placed_s + refused_s),
        "filter_placed": _summary(placed_s),
        "filter_refused": _summary(refused_s),
        "mix_refits": view.mix.generation,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.extender.openb_filter",
        description=(__doc__ or "").split("\n\n")[0],
    )
    p.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="openb CSV directory")
    p.add_argument("--trace", default="default", help="pod list name in --traces")
    p.add_argument("--nodes", type=Path, help="node list CSV (default: the openb GPU nodes)")
    p.add_argument("--pods", type=Path, help="pod list CSV (replaces --trace)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--ratio", type=float, default=1.3, help="arrivals up to this x capacity")
    p.add_argument("--limit", type=int, help="only the first N arrivals")
    p.add_argument("--profile", action="store_true", help="print where the time went")
    p.add_argument("--out", type=Path, help="write the summary as JSON here")
    ns = p.parse_args(argv)
    nodes = load_nodes(ns.nodes or ns.traces / "openb_node_list_gpu_node.csv")
    pods = load_pods(ns.pods or pod_lists(ns.traces)[ns.trace])
    gc.freeze()
    profiler = cProfile.Profile() if ns.profile else None
    if profiler is not None:
        profiler.enable()
    result = run(nodes, pods, seed=ns.seed, ratio=ns.ratio, limit=ns.limit)
    if profiler is not None:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    result["machine"] = (
        f"{platform.processor() or platform.machine()}, Python {sys.version.split()[0]}"
    )
    print(json.dumps(result, indent=2))
    if ns.out is not None:
        ns.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
