"""Scheduling throughput at scale: ``python -m bench.scale.run --nodes 1000 --pods 10000``.

Starts a separate control plane (hack/kwok-cluster.sh), lets KWOK fake ``--nodes`` GPU nodes,
runs the gpushare controller's extender against it, then measures two phases on the same nodes:

1. stock: the default kube-scheduler places whole-GPU pods (``gpushare.io/gpu-percent: 100``,
   no extender) - the reference rate;
2. extender: gpushare-scheduler + the extender place fractional pods shaped like the openb trace.

Then checks the packing invariant on every GPU and writes ``<out>.json`` and ``<out>.md``.
"""

import argparse
import asyncio
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.scale import dra, harness, metrics
from bench.scale.invariant import check
from bench.scale.kube import Api, ApiError, Json, client_ssl
from bench.scale.phase import PhaseTiming, run_phase
from bench.scale.report import render_markdown
from bench.scale.workload import (
    BENCH_LABEL,
    DEFAULT_TRACE_FILE,
    NodeShape,
    fractional_pod,
    node_manifest,
    node_name,
    read_trace,
    take,
    whole_gpu_pod,
)
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import SCHEDULER_NAME

log = logging.getLogger("bench.scale")

NAMESPACE = "gpushare-scale"
DEFAULT_TRACES = harness.REPO.parent / "shared" / "traces" / "openb"
DEFAULT_OUT = harness.REPO / "bench" / "results" / "scale"
SLI = "scheduler_pod_scheduling_sli_duration_seconds"
ATTEMPT = "scheduler_scheduling_attempt_duration_seconds"
EXTENSION_POINT = "scheduler_framework_extension_point_duration_seconds"
ALGORITHM = "scheduler_scheduling_algorithm_duration_seconds"
"""schedulePod: the framework's filters, the extenders' filter calls, then scoring (one
scheduler process per profile here, so it needs no profile label)."""
CYCLE_POINTS = ("PreFilter", "Filter", "PreScore", "Score")
"""Its ``Bind`` series is the stock scheduler's own binding (DefaultBinder's Binding POST):
the reference for the extender's bind latency under the same API server. kube-scheduler skips
its bind plugins when an extender binds, so gpushare-scheduler's series stays empty."""
TARGETS = {
    "extender_pods_per_s": 100.0,
    "ratio_to_stock": 0.8,
    "filter_p99_ms": 5.0,
    "bind_p99_ms": 10.0,
    "controller_rss_mib": 2048.0,
    "dra_ratio_to_extender": 0.8,
    "violations": 0,
}
"""Issue 47's targets: the default policy at >= 0.8x the stock scheduler's rate, filter p99
<= 5 ms and bind p99 <= 10 ms, the controller's peak RSS <= 2 GiB (at 5,000 nodes), DRA mode
at >= 0.8x the extender path's rate, no violation."""


DRA_PLACEMENTS = ("gpushare", "kube-scheduler")
"""Who allocates the claims of --dra's phases: the controller (``dra-gpushare``) or
kube-scheduler's allocator (``dra``)."""


@dataclass(frozen=True)
class Options:
    nodes: int
    pods: int
    stock_pods: int
    traces: Path
    trace_file: str
    concurrency: int
    state_dir: Path
    extender_port: int
    out: Path
    keep: bool
    stall_timeout_s: float
    timeout_s: float
    controller_args: list[str] = field(default_factory=list)
    require_extender: bool = True
    profile_controller: Path | None = None
    controller_source: Path | None = None
    protocol_floor: bool = False
    logs: Path | None = None
    backlog_pods: int = 0
    dedicated_host: bool = False
    machine_label: str | None = None
    gpushare_nodes_percent: int | None = None
    dra: bool = False
    dra_placements: tuple[str, ...] = DRA_PLACEMENTS
    sample_controller: Path | None = None


def parse_args(argv: Sequence[str] | None = None) -> Options:
    p = argparse.ArgumentParser(
        prog="python -m bench.scale.run",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--nodes", type=int, help="fake GPU nodes, 8 GPUs each (default 1000)")
    p.add_argument("--pods", type=int, help="fractional pods for the extender (default 10000)")
    p.add_argument(
        "--stock-pods",
        type=int,
        default=None,
        help="whole-GPU pods for the stock scheduler (default: min(--pods, 6 per node))",
    )
    p.add_argument("--small", action="store_true", help="smoke-test size: 20 nodes, 200 pods")
    p.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="openb trace directory")
    p.add_argument("--trace-file", default=DEFAULT_TRACE_FILE, help="pod list in --traces")
    p.add_argument("--concurrency", type=int, default=32, help="parallel pod creations")
    p.add_argument("--state-dir", type=Path, default=harness.DEFAULT_STATE_DIR)
    p.add_argument("--extender-port", type=int, default=harness.DEFAULT_EXTENDER_PORT)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results prefix (.json, .md)")
    p.add_argument("--keep", action="store_true", help="leave the control plane running")
    p.add_argument(
        "--stock-only",
        action="store_true",
        help="only the stock-scheduler phase (checks the harness without the controller)",
    )
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=60.0,
        help="give up after this many seconds without a pod bound",
    )
    p.add_argument("--timeout", type=float, default=1800.0, help="limit per phase, seconds")
    p.add_argument(
        "--controller-arg",
        action="append",
        default=[],
        help="extra gpushare-controller argument (repeatable): --controller-arg=--policy=spread",
    )
    p.add_argument(
        "--profile-controller",
        type=Path,
        help="run the controller under cProfile and write its profile to this file",
    )
    p.add_argument(
        "--sample-controller",
        type=Path,
        help="sample the controller with py-spy (when installed) during the extender phase and "
        "write its stacks here (speedscope JSON): where its time goes, at full speed; with "
        "--dra, the dra-gpushare phase's go beside it (NAME.dra-gpushare.json)",
    )
    p.add_argument(
        "--controller-source",
        type=Path,
        help="directory with a gpushare package to run as the controller instead of this "
        "checkout's (measure a patch on a copy without touching the tree)",
    )
    p.add_argument(
        "--protocol-floor",
        action="store_true",
        help="run the controller without its placement (bench.scale.floor: filter offers the "
        "first node, bind only writes the Binding): what an extender costs before it decides "
        "anything; its pods get no GPUs, so each counts as a violation",
    )
    p.add_argument(
        "--backlog-pods",
        type=int,
        default=None,
        help="also measure each scheduler draining this many pods created while it was paused "
        "(its rate without the creation bound); default min(--pods, 2000), 0 skips",
    )
    p.add_argument(
        "--logs",
        type=Path,
        help="copy every component's log here before the control plane is removed",
    )
    p.add_argument(
        "--dedicated-host",
        action="store_true",
        help="record the machine as dedicated to this run (default: a shared host)",
    )
    p.add_argument(
        "--machine-label",
        help="short name of the machine, written into the results (e.g. '16-core device')",
    )
    p.add_argument(
        "--gpushare-nodes-percent",
        type=int,
        help="percentageOfNodesToScore of the gpushare-scheduler profile (1-100): how many "
        "feasible nodes kube-scheduler looks for, and sends to the extender, per pod "
        "(default: kube-scheduler's adaptive share, 42%% at 1000 nodes; the stock "
        "scheduler keeps its default)",
    )
    p.add_argument(
        "--dra",
        action="store_true",
        help="also run the DRA phase: the extender phase's pods as ResourceClaims allocated by "
        "the stock kube-scheduler from the node agent's ResourceSlices (feature gate "
        "DRAConsumableCapacity on), compared with the extender phase",
    )
    p.add_argument(
        "--dra-placement",
        choices=DRA_PLACEMENTS,
        action="append",
        help="with --dra, only the DRA phase of this placement (repeatable; default both): "
        "gpushare (dra-gpushare, what mode dra installs) or kube-scheduler (dra, its allocator)",
    )
    ns = p.parse_args(argv)
    nodes = ns.nodes if ns.nodes is not None else (20 if ns.small else 1000)
    pods = ns.pods if ns.pods is not None else (200 if ns.small else 10000)
    stock = ns.stock_pods if ns.stock_pods is not None else min(pods, 6 * nodes)
    for flag, value, low in (
        ("--nodes", nodes, 1),
        ("--pods", pods, 1),
        ("--stock-pods", stock, 0),
        ("--concurrency", ns.concurrency, 1),
    ):
        if value < low:
            raise InvalidInputError(flag, f"{value} is below {low}", f"give at least {low}")
    if ns.gpushare_nodes_percent is not None and not 1 <= ns.gpushare_nodes_percent <= 100:
        raise InvalidInputError(
            "--gpushare-nodes-percent",
            f"{ns.gpushare_nodes_percent} is not a percentage",
            "give 1-100, or leave it out for kube-scheduler's adaptive share",
        )
    if ns.protocol_floor and (ns.controller_source or ns.dra or ns.stock_only):
        other = (
            "--controller-source" if ns.controller_source else "--dra" if ns.dra else "--stock-only"
        )
        raise InvalidInputError(
            "--protocol-floor",
            f"cannot be combined with {other}",
            "the floor is this checkout's extender path without placement; run it on its own",
        )
    if stock > 8 * nodes:
        raise InvalidInputError(
            "--stock-pods",
            f"{stock} whole-GPU pods do not fit on {nodes} nodes of 8 GPUs",
            f"give at most {8 * nodes} (default: 6 per node)",
        )
    return Options(
        nodes=nodes,
        pods=pods,
        stock_pods=stock,
        traces=ns.traces,
        trace_file=ns.trace_file,
        concurrency=ns.concurrency,
        state_dir=ns.state_dir,
        extender_port=ns.extender_port,
        out=ns.out,
        keep=ns.keep,
        stall_timeout_s=ns.stall_timeout,
        timeout_s=ns.timeout,
        controller_args=list(ns.controller_arg),
        require_extender=not ns.stock_only,
        profile_controller=ns.profile_controller,
        sample_controller=ns.sample_controller,
        controller_source=ns.controller_source,
        protocol_floor=ns.protocol_floor,
        logs=ns.logs,
        backlog_pods=ns.backlog_pods if ns.backlog_pods is not None else min(pods, 2000),
        dedicated_host=ns.dedicated_host,
        machine_label=ns.machine_label,
        gpushare_nodes_percent=ns.gpushare_nodes_percent,
        dra=ns.dra,
        dra_placements=tuple(ns.dra_placement or DRA_PLACEMENTS),
    )


class Scraper:
    """/metrics of the two schedulers (secure ports, admin client certificate) and of the
    controller (plain HTTP on the extender port)."""

    def __init__(self, *, kubeconfig: Path, controller_url: str | None) -> None:
        ssl = client_ssl(kubeconfig, verify=False)
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl))
        self.controller_url = controller_url

    async def get(self, url: str) -> str:
        async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=30)) as resp:
            resp.raise_for_status()
            return await resp.text()

    async def scheduler(self, port: int) -> str:
        return await self.get(f"https://127.0.0.1:{port}/metrics")

    async def controller(self) -> str:
        if self.controller_url is None:
            return ""
        return await self.get(self.controller_url + "/metrics")

    async def close(self) -> None:
        await self.session.close()


async def create_all(api: Api, path: str, objs: Sequence[Json], concurrency: int) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one(obj: Json) -> None:
        async with sem:
            await api.create(path, obj)

    await asyncio.gather(*(one(o) for o in objs))


def node_ready(node: Json) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in node.get("status", {}).get("conditions", [])
    )


async def wait_until(what: str, timeout_s: float, probe: Any) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await probe():
            return
        await asyncio.sleep(0.5)
    raise harness.HarnessError(f"timed out after {timeout_s:.0f}s waiting for {what}")


async def setup_nodes(api: Api, scraper: Scraper, *, nodes: int, concurrency: int) -> float:
    """Create the fake nodes; wait until kwok made them Ready and both schedulers see them.
    Returns seconds taken."""
    t0 = time.monotonic()
    shape = NodeShape()
    await create_all(
        api, "/api/v1/nodes", [node_manifest(i, shape) for i in range(nodes)], concurrency
    )

    async def all_ready() -> bool:
        listed = await api.list_all(
            "/api/v1/nodes", params={"labelSelector": f"{BENCH_LABEL}=nodes"}
        )
        return sum(1 for n in listed["items"] if node_ready(n)) >= nodes

    await wait_until(f"{nodes} nodes Ready (kwok)", 300, all_ready)

    async def schedulers_see_nodes() -> bool:
        for port in (harness.KUBE_SCHEDULER_PORT, harness.GPUSHARE_SCHEDULER_PORT):
            text = await scraper.scheduler(port)
            if (
                metrics.counter(
                    text, "scheduler_cache_size", lambda labels: labels.get("type") == "nodes"
                )
                < nodes
            ):
                return False
        return True

    await wait_until("both schedulers to cache every node", 120, schedulers_see_nodes)
    return time.monotonic() - t0


async def setup_namespace(api: Api) -> None:
    await api.create(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
    )
    # No controller-manager runs: make the service account the admission plugin looks up.
    await api.create(
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
    )


def scheduler_summary(before: str, after: str, *, profile: str) -> dict[str, Any]:
    """The scheduler's own view of the phase: its SLI and attempt histograms, attempts by
    result."""

    def scheduled(labels: Any) -> bool:
        return bool(labels.get("profile") == profile and labels.get("result") == "scheduled")

    sli = metrics.histogram(after, SLI).minus(metrics.histogram(before, SLI))
    attempt = metrics.histogram(after, ATTEMPT, scheduled).minus(
        metrics.histogram(before, ATTEMPT, scheduled)
    )
    results: dict[str, int] = {}
    for result in ("scheduled", "unschedulable", "error"):

        def by_result(labels: Any, r: str = result) -> bool:
            return bool(labels.get("profile") == profile and labels.get("result") == r)

        results[result] = int(
            metrics.histogram(after, ATTEMPT, by_result).count
            - metrics.histogram(before, ATTEMPT, by_result).count
        )

    def bound(labels: Any) -> bool:
        return bool(
            labels.get("profile") == profile
            and labels.get("extension_point") == "Bind"
            and labels.get("status") == "Success"
        )

    binding = metrics.histogram(after, EXTENSION_POINT, bound).minus(
        metrics.histogram(before, EXTENSION_POINT, bound)
    )
    algorithm = metrics.histogram(after, ALGORITHM).minus(metrics.histogram(before, ALGORITHM))
    points = _point_means(before, after, profile=profile)
    outside = None
    if algorithm.mean is not None and points.get("Filter") is not None:
        outside = round(algorithm.mean * 1000.0 - sum(v or 0.0 for v in points.values()), 3)
    return {
        "pod_scheduling_sli": metrics.summarize(sli),
        "scheduling_attempt_scheduled": metrics.summarize(attempt),
        "bind_plugins": metrics.summarize(binding),
        "scheduling_algorithm": metrics.summarize(algorithm),
        "extension_points_mean_ms": points,
        # What of the algorithm's mean its own points do not account for: for
        # gpushare-scheduler the extender's filter call as kube-scheduler waits for it.
        "algorithm_outside_points_mean_ms": outside,
        "attempts_by_result": results,
    }


def _point_means(before: str, after: str, *, profile: str) -> dict[str, float | None]:
    """Mean time per call of the framework's own filter and score points: what of
    ``scheduling_algorithm`` is not the extenders' filter calls (docs/scale.md)."""
    out: dict[str, float | None] = {}
    for point in CYCLE_POINTS:

        def at(labels: Any, p: str = point) -> bool:
            return bool(labels.get("profile") == profile and labels.get("extension_point") == p)

        h = metrics.histogram(after, EXTENSION_POINT, at).minus(
            metrics.histogram(before, EXTENSION_POINT, at)
        )
        mean = h.mean
        out[point] = None if mean is None else round(mean * 1000.0, 3)
    return out


EXTENDER_VERBS = ("filter", "prioritize", "bind")


def extender_summary(before: str, after: str) -> tuple[str | None, dict[str, Any]]:
    """Per-verb latency from the controller's /metrics: the first histogram whose name mentions
    the extender and that has a ``verb`` label. (None, {}) when it exposes none."""
    candidates = [
        f.name
        for f in text_string_to_metric_families(after)
        if f.type == "histogram"
        and "extender" in f.name
        and any("verb" in s.labels for s in f.samples)
    ]
    if not candidates:
        return None, {}
    name = sorted(candidates, key=lambda n: (not n.endswith("_seconds"), n))[0]
    out: dict[str, Any] = {}
    for verb in metrics.label_values(after, name, "verb"):

        def of_verb(labels: Any, v: str = verb) -> bool:
            return bool(labels.get("verb") == v)

        h = metrics.histogram(after, name, of_verb).minus(metrics.histogram(before, name, of_verb))
        if h.count > 0:
            out[verb] = metrics.summarize(h)
    return name, out


BIND_STAGE_METRIC = "gpushare_extender_bind_stage_seconds"
LOOP_TURN_METRIC = "gpushare_controller_loop_turn_seconds"
LOOP_DELAY_METRIC = "gpushare_controller_loop_delay_seconds"


def bind_stage_summary(before: str, after: str) -> dict[str, Any]:
    """Where bind time goes (controller histogram ``BIND_STAGE_METRIC`` by ``stage``): the
    allocation gate or the write. Empty for a controller without the histogram."""
    out: dict[str, Any] = {}
    for stage in metrics.label_values(after, BIND_STAGE_METRIC, "stage"):

        def of_stage(labels: Any, v: str = stage) -> bool:
            return bool(labels.get("stage") == v)

        h = metrics.histogram(after, BIND_STAGE_METRIC, of_stage).minus(
            metrics.histogram(before, BIND_STAGE_METRIC, of_stage)
        )
        if h.count > 0:
            out[stage] = metrics.summarize(h)
    return out


def loop_summary(before: str, after: str, wall_s: float) -> dict[str, Any]:
    """The controller's event loop over a phase (``gpushare.cluster.event_loop``): its turns,
    the share of the phase it was busy, and the mean wait of a request arriving at a random
    moment for the turn in progress. Empty for a controller without the series."""
    turns = metrics.histogram(after, LOOP_TURN_METRIC).minus(
        metrics.histogram(before, LOOP_TURN_METRIC)
    )
    if turns.count <= 0 or wall_s <= 0:
        return {}
    delay = metrics.counter(after, LOOP_DELAY_METRIC) - metrics.counter(before, LOOP_DELAY_METRIC)
    return {
        "turns": int(turns.count),
        "turns_per_s": round(turns.count / wall_s, 1),
        "busy_share": round(turns.sum / wall_s, 3),
        "turn": metrics.summarize(turns),
        "mean_wait_for_turn_ms": round(1000 * delay / wall_s, 3),
    }


def _sample_file(base: Path | None, phase: str) -> Path | None:
    """Where ``--sample-controller`` writes this phase's samples: the extender phase to the
    file given, the DRA phase the controller places (``dra-gpushare``) beside it with the
    phase in its name; None for phases the controller does not place."""
    if base is None:
        return None
    if phase == "extender":
        return base
    if phase == dra.GPUSHARE_PHASE:
        return base.with_name(f"{base.stem}.{phase}{base.suffix}")
    return None


async def measure_phase(
    api: Api,
    scraper: Scraper,
    cp: harness.ControlPlane,
    *,
    phase: str,
    manifests: list[Json],
    scheduler_port: int,
    profile: str,
    opts: Options,
    extra_pids: dict[str, int],
    backlog: bool = False,
) -> dict[str, Any]:
    log.info("phase %s: %d pods%s", phase, len(manifests), " (backlog)" if backlog else "")
    sched_before = await scraper.scheduler(scheduler_port)
    ctl_before = await scraper.controller() if profile == SCHEDULER_NAME else ""
    scraped_at = time.monotonic()
    pids = {**cp.pids(), **extra_pids, "bench": os.getpid()}
    cpu_before = harness.sample_cpu(pids)
    sampler = None
    target = _sample_file(opts.sample_controller, phase)
    if target is not None and "gpushare-controller" in pids:
        sampler = harness.start_sampler(pids["gpushare-controller"], target)
    scheduler_pid = pids[
        "kube-scheduler" if profile == "default-scheduler" else "gpushare-scheduler"
    ]
    timing: PhaseTiming = await run_phase(
        api,
        namespace=NAMESPACE,
        phase=phase,
        manifests=manifests,
        concurrency=opts.concurrency,
        stall_timeout_s=opts.stall_timeout_s,
        timeout_s=opts.timeout_s,
        pause=(lambda: harness.pause(scheduler_pid)) if backlog else None,
        resume=(lambda: harness.resume(scheduler_pid)) if backlog else None,
    )
    cpu_after = harness.sample_cpu(pids)
    harness.stop_sampler(sampler)
    sched_after = await scraper.scheduler(scheduler_port)
    result: dict[str, Any] = timing.summary()
    result["scheduler"] = scheduler_summary(sched_before, sched_after, profile=profile)
    result["cpu_cores_used"] = harness.cpu_usage(cpu_before, cpu_after)
    if "gpushare-controller" in pids:
        result["controller_memory_mib"] = harness.memory_mib(pids["gpushare-controller"])
    if profile == SCHEDULER_NAME:
        ctl_after = await scraper.controller()
        name, verbs = extender_summary(ctl_before, ctl_after)
        result["extender_metric"] = name
        result["extender_latency"] = verbs
        result["bind_stages"] = bind_stage_summary(ctl_before, ctl_after)
        result["controller_loop"] = loop_summary(
            ctl_before, ctl_after, time.monotonic() - scraped_at
        )
    log.info(
        "phase %s: %s/%s bound in %ss: %s pods/s (creation %s pods/s, drain %s pods/s)",
        phase,
        result["bound"],
        result["pods"],
        result["duration_s"],
        result["pods_per_s"],
        result["creation_pods_per_s"],
        result.get("drain_pods_per_s"),
    )
    return result


async def delete_phase_pods(api: Api, phase: str) -> None:
    """Delete a phase's pods (grace 0) and wait until they are gone. A DELETE collection of
    thousands of pods can outlive the API server's request timeout; it is then sent again."""
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    selector = f"{BENCH_LABEL}={phase}"
    deadline = time.monotonic() + 600

    async def left() -> int:
        listed = await api.request("GET", path, params={"labelSelector": selector, "limit": "1"})
        remaining = listed.get("metadata", {}).get("remainingItemCount", 0)
        return len(listed.get("items", [])) + int(remaining or 0)

    while time.monotonic() < deadline:
        try:
            await api.delete_collection(path, label_selector=selector)
        except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.info("delete of %s pods interrupted (%s); sending it again", phase, exc)
        for _ in range(60):
            if await left() == 0:
                return
            await asyncio.sleep(0.5)
    raise harness.HarnessError(f"{phase} pods still present after 600s of deleting")


async def dra_setup(api: Api, opts: Options) -> None:
    """The chart's DeviceClass and every node's ResourceSlice (as its agent publishes it)."""
    log.info("dra: DeviceClass and %d ResourceSlices", opts.nodes)
    await api.create("/apis/resource.k8s.io/v1/deviceclasses", dra.device_class())
    shape = NodeShape()
    await create_all(
        api,
        "/apis/resource.k8s.io/v1/resourceslices",
        [dra.node_slice(node_name(i), shape) for i in range(opts.nodes)],
        opts.concurrency,
    )


CLAIMS_PATH = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"


async def dra_phase(
    api: Api,
    scraper: Scraper,
    cp: harness.ControlPlane,
    *,
    phase: str,
    fractional: Sequence[Any],
    opts: Options,
    extra_pids: dict[str, int],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The extender phase's pods as claims (bench.scale.dra) on the same nodes, allocated by
    the controller (``dra-gpushare``: gated pods) or by kube-scheduler (``dra``); returns
    (phase timing, what was allocated). Either way kube-scheduler binds the pods."""
    log.info("%s: %d ResourceClaims (made before the clock starts)", phase, len(fractional))
    await create_all(
        api,
        CLAIMS_PATH,
        [dra.claim(i, t, namespace=NAMESPACE, phase=phase) for i, t in enumerate(fractional)],
        opts.concurrency,
    )
    result = await measure_phase(
        api,
        scraper,
        cp,
        phase=phase,
        manifests=[
            dra.pod(i, t, namespace=NAMESPACE, phase=phase) for i, t in enumerate(fractional)
        ],
        scheduler_port=harness.KUBE_SCHEDULER_PORT,
        profile="default-scheduler",
        opts=opts,
        extra_pids=extra_pids,
    )
    listed = await api.list_all(CLAIMS_PATH, params={"labelSelector": f"{BENCH_LABEL}={phase}"})
    return result, dra.check(listed["items"])


async def clear_dra_phase(api: Api, phase: str, concurrency: int) -> None:
    """Delete a DRA phase's pods and claims. No kube-controller-manager runs here to lift the
    claims' delete-protection finalizer once their pods are gone, so this does."""
    await delete_phase_pods(api, phase)
    listed = await api.list_all(CLAIMS_PATH, params={"labelSelector": f"{BENCH_LABEL}={phase}"})
    sem = asyncio.Semaphore(concurrency)

    async def release(claim: Json) -> None:
        async with sem:
            await api.request(
                "PATCH",
                f"{CLAIMS_PATH}/{claim['metadata']['name']}",
                body={"metadata": {"finalizers": None}},
                content_type="application/merge-patch+json",
            )

    await asyncio.gather(*(release(c) for c in listed["items"] if c["metadata"].get("finalizers")))
    await api.delete_collection(CLAIMS_PATH, label_selector=f"{BENCH_LABEL}={phase}")


async def run(opts: Options) -> dict[str, Any]:
    started = datetime.now(UTC)
    machine = harness.machine_description(
        shared_host=not opts.dedicated_host, label=opts.machine_label
    )
    source = harness.source_state()
    trace = read_trace(opts.traces, file=opts.trace_file)
    fractional = take(trace, opts.pods, fractional=True)
    whole = take(trace, opts.stock_pods, fractional=False) if opts.stock_pods else []
    if opts.require_extender and not harness.controller_available():
        raise harness.HarnessError(
            "gpushare.cluster has no __main__ (the extender) in this checkout; "
            "nothing to measure (--stock-only checks the rest)"
        )
    log.info("control plane up (%s)", opts.state_dir)
    cp = harness.control_plane_up(
        state_dir=opts.state_dir,
        extender_port=opts.extender_port,
        gpushare_nodes_percent=opts.gpushare_nodes_percent,
        feature_gates=dra.FEATURE_GATES if opts.dra else "",
        dra=opts.dra,
    )
    api = Api.connect(kubeconfig=cp.kubeconfig, connections=max(opts.concurrency, 8) + 4)
    controller: harness.Controller | None = None
    scraper = Scraper(
        kubeconfig=cp.kubeconfig,
        controller_url=f"http://127.0.0.1:{opts.extender_port}" if opts.require_extender else None,
    )
    try:
        version = await api.request("GET", "/version")
        await setup_namespace(api)
        log.info("creating %d kwok nodes", opts.nodes)
        nodes_s = await setup_nodes(api, scraper, nodes=opts.nodes, concurrency=opts.concurrency)
        log.info("nodes ready in %.1fs; starting the controller", nodes_s)
        extra: dict[str, int] = {}
        if opts.require_extender:
            controller = await harness.start_controller(
                kubeconfig=cp.kubeconfig,
                port=opts.extender_port,
                log_path=cp.logs / "gpushare-controller.log",
                extra_args=[*(dra.CONTROLLER_ARGS if opts.dra else ()), *opts.controller_args],
                ready_timeout=180,
                profile_to=opts.profile_controller,
                source=opts.controller_source,
                module="bench.scale.floor" if opts.protocol_floor else "gpushare.cluster",
            )
            extra["gpushare-controller"] = controller.proc.pid
        phases: dict[str, Any] = {}
        invariants: list[dict[str, Any]] = []
        backlog = opts.backlog_pods

        async def invariant() -> dict[str, Any]:
            node_list = await api.list_all("/api/v1/nodes")
            pod_list = await api.list_all(f"/api/v1/namespaces/{NAMESPACE}/pods")
            return check(node_list["items"], pod_list["items"]).summary()

        if whole:
            if backlog:
                phases["stock_backlog"] = await measure_phase(
                    api,
                    scraper,
                    cp,
                    phase="stock-backlog",
                    manifests=[
                        whole_gpu_pod(i, t, namespace=NAMESPACE, phase="stock-backlog")
                        for i, t in enumerate(whole[:backlog])
                    ],
                    scheduler_port=harness.KUBE_SCHEDULER_PORT,
                    profile="default-scheduler",
                    opts=opts,
                    extra_pids=extra,
                    backlog=True,
                )
                await delete_phase_pods(api, "stock-backlog")
            phases["stock"] = await measure_phase(
                api,
                scraper,
                cp,
                phase="stock",
                manifests=[whole_gpu_pod(i, t, namespace=NAMESPACE) for i, t in enumerate(whole)],
                scheduler_port=harness.KUBE_SCHEDULER_PORT,
                profile="default-scheduler",
                opts=opts,
                extra_pids=extra,
            )
            if opts.require_extender:
                await delete_phase_pods(api, "stock")
        if opts.require_extender:
            if backlog:
                phases["extender_backlog"] = await measure_phase(
                    api,
                    scraper,
                    cp,
                    phase="extender-backlog",
                    manifests=[
                        fractional_pod(i, t, namespace=NAMESPACE, phase="extender-backlog")
                        for i, t in enumerate(fractional[:backlog])
                    ],
                    scheduler_port=harness.GPUSHARE_SCHEDULER_PORT,
                    profile=SCHEDULER_NAME,
                    opts=opts,
                    extra_pids=extra,
                    backlog=True,
                )
                invariants.append(await invariant())
                await delete_phase_pods(api, "extender-backlog")
            phases["extender"] = await measure_phase(
                api,
                scraper,
                cp,
                phase="extender",
                manifests=[
                    fractional_pod(i, t, namespace=NAMESPACE) for i, t in enumerate(fractional)
                ],
                scheduler_port=harness.GPUSHARE_SCHEDULER_PORT,
                profile=SCHEDULER_NAME,
                opts=opts,
                extra_pids=extra,
            )
        final = await invariant()
        if invariants:
            final["violations"] += sum(i["violations"] for i in invariants)
            final["violation_examples"] += [v for i in invariants for v in i["violation_examples"]][
                :20
            ]
            final["backlog_phase"] = invariants[0]
        if opts.dra:
            if opts.require_extender:
                await delete_phase_pods(api, "extender")
            await dra_setup(api, opts)
            if "kube-scheduler" in opts.dra_placements:
                phases[dra.PHASE], final[dra.PHASE] = await dra_phase(
                    api, scraper, cp, phase=dra.PHASE, fractional=fractional, opts=opts,
                    extra_pids=extra,
                )  # fmt: skip
            if opts.require_extender and "gpushare" in opts.dra_placements:
                if dra.PHASE in phases:
                    await clear_dra_phase(api, dra.PHASE, opts.concurrency)
                key = dra.GPUSHARE_PHASE.replace("-", "_")
                phases[key], final[key] = await dra_phase(
                    api, scraper, cp, phase=dra.GPUSHARE_PHASE, fractional=fractional,
                    opts=opts, extra_pids=extra,
                )  # fmt: skip
    finally:
        if controller is not None:
            controller.stop()
        await scraper.close()
        await api.close()
        if opts.logs is not None:
            shutil.copytree(cp.logs, opts.logs, dirs_exist_ok=True)
        if not opts.keep:
            cp.script("down")
    return assemble(
        opts,
        machine=machine,
        started=started,
        version=version,
        nodes_s=nodes_s,
        phases=phases,
        invariant=final,
        source=source,
    )


def assemble(
    opts: Options,
    *,
    machine: dict[str, Any],
    started: datetime,
    version: Json,
    nodes_s: float,
    phases: dict[str, Any],
    invariant: dict[str, Any],
    source: dict[str, Any],
) -> dict[str, Any]:
    empty: dict[str, Any] = {"pods_per_s": None, "bound": 0, "pods": 0}
    ext = phases.get("extender", empty)
    stock = phases.get("stock")
    ext_rate = ext["pods_per_s"] or 0.0
    stock_rate = stock["pods_per_s"] if stock else None
    ratio = round(ext_rate / stock_rate, 3) if stock_rate else None
    p99 = {v: s.get("p99_ms") for v, s in ext.get("extender_latency", {}).items()}
    dra_rate = phases["dra"]["pods_per_s"] if "dra" in phases else None
    dra_ratio = _ratio(dra_rate, ext_rate or None)
    dra_alloc = invariant.get("dra")
    placed = phases.get("dra_gpushare")
    placed_rate = placed["pods_per_s"] if placed else None
    placed_ratio = _ratio(placed_rate, ext_rate or None)
    placed_alloc = invariant.get("dra_gpushare")
    rss = max(
        (
            m["peak"]
            for ph in phases.values()
            if isinstance(m := ph.get("controller_memory_mib"), dict) and "peak" in m
        ),
        default=None,
    )
    dra_targets: dict[str, bool] = {}
    if placed_alloc is not None:
        # #23: DRA mode, as installed (the controller places claims), schedules the same
        # workload at least as fast (within 5 %) as device-plugin mode ...
        dra_targets["dra_gpushare_pods_per_s >= 0.8 x extender"] = (
            placed_ratio is not None and placed_ratio >= TARGETS["dra_ratio_to_extender"]
        )
        # ... with every claim allocated and no GPU handed out beyond 100 %.
        dra_targets["dra_gpushare violations == 0"] = (
            placed_alloc["violations"] == 0 and placed_alloc["claims_allocated"] == opts.pods
        )
    if dra_alloc is not None:
        # The same with kube-scheduler's allocator (dra.placement: kube-scheduler).
        dra_targets["dra_pods_per_s >= 0.95 x extender"] = (
            dra_ratio is not None and dra_ratio >= 0.95
        )
        dra_targets["dra violations == 0"] = (
            dra_alloc["violations"] == 0 and dra_alloc["claims_allocated"] == opts.pods
        )
    stock_bind = phases.get("stock", {}).get("scheduler", {}).get("bind_plugins", {})
    modes = run_summary(
        opts, machine, ext_rate=ext_rate, stock_rate=stock_rate, p99=p99, rss=rss,
        violations=invariant["violations"], dra_rate=placed_rate, dra_alloc=placed_alloc,
    )  # fmt: skip
    return {
        "nodes": opts.nodes,
        "gpus": opts.nodes * NodeShape().gpus,
        # Issue 47's fields for the extender path (``modes`` has DRA mode's too).
        "policy": modes[0]["policy"],
        "mode": modes[0]["mode"],
        "pods_per_s": ext_rate,
        "filter_p99_ms": p99.get("filter"),
        "bind_p99_ms": p99.get("bind"),
        "stock_bind_p99_ms": stock_bind.get("p99_ms"),
        "pods": opts.pods,
        "pods_bound": ext["bound"],
        "stock_pods": opts.stock_pods,
        "extender_pods_per_s": ext_rate,
        "stock_pods_per_s": stock_rate,
        "ratio_to_stock": ratio,
        "extender_drain_pods_per_s": phases.get("extender_backlog", {}).get("drain_pods_per_s"),
        "stock_drain_pods_per_s": phases.get("stock_backlog", {}).get("drain_pods_per_s"),
        "drain_ratio_to_stock": _ratio(
            phases.get("extender_backlog", {}).get("drain_pods_per_s"),
            phases.get("stock_backlog", {}).get("drain_pods_per_s"),
        ),
        "extender_p99_ms": p99,
        "extender_p99_beyond_last_bucket": [
            v for v, s in ext.get("extender_latency", {}).items() if s.get("p99_beyond_last_bucket")
        ],
        "violations": invariant["violations"],
        "dra_pods_per_s": dra_rate,
        "dra_ratio_to_extender": dra_ratio,
        "dra_gpushare_pods_per_s": placed_rate,
        "dra_gpushare_ratio_to_extender": placed_ratio,
        "controller_rss_mib": rss,
        "targets": {
            **dra_targets,
            "extender_pods_per_s >= 100": ext_rate >= TARGETS["extender_pods_per_s"],
            "ratio_to_stock >= 0.8": ratio is not None and ratio >= TARGETS["ratio_to_stock"],
            "filter_p99_ms <= 5": p99.get("filter") is not None
            and p99["filter"] <= TARGETS["filter_p99_ms"],
            "bind_p99_ms <= 10": p99.get("bind") is not None
            and p99["bind"] <= TARGETS["bind_p99_ms"],
            "controller_rss_mib <= 2048": rss is not None and rss <= TARGETS["controller_rss_mib"],
            "violations == 0": invariant["violations"] == 0 and ext["bound"] == ext["pods"],
        },
        "modes": modes,
        "invariant": invariant,
        "phases": phases,
        "setup": {
            "node_setup_s": round(nodes_s, 1),
            "node_shape": {
                "gpus": NodeShape().gpus,
                "gpu_model": NodeShape().gpu_model,
                "cpu_milli": NodeShape().cpu_milli,
                "memory_mib": NodeShape().memory_mib,
            },
            "trace_file": opts.trace_file,
            "concurrency": opts.concurrency,
            "backlog_pods": opts.backlog_pods,
            "controller_args": opts.controller_args,
            "controller_source": (
                "protocol floor (bench.scale.floor: no placement)"
                if opts.protocol_floor
                else "copy (--controller-source)"
                if opts.controller_source
                else "checkout"
            ),
            **source,
            "kubernetes": version.get("gitVersion"),
            "scheduler_client_qps": int(os.environ.get("GPUSHARE_SCALE_SCHEDULER_QPS", "5000")),
            "kwok_pod_workers": int(os.environ.get("GPUSHARE_SCALE_KWOK_POD_WORKERS", "256")),
            "gpushare_percentage_of_nodes_to_score": opts.gpushare_nodes_percent,
        },
        "machine": machine,
        "date": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def run_summary(
    opts: Options,
    machine: dict[str, Any],
    *,
    ext_rate: float,
    stock_rate: float | None,
    p99: dict[str, float | None],
    rss: float | None,
    violations: int,
    dra_rate: float | None,
    dra_alloc: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """One line per mode measured, in the shape issue 47 asks for (the ``runs`` list of
    ``bench/results/scale.json``): the extender path and, with ``--dra``, DRA mode with
    gpushare placing the claims."""
    policy = next(
        (a.split("=", 1)[1] for a in opts.controller_args if a.startswith("--policy=")), "gpushare"
    )
    label = str(machine.get("label") or opts.machine_label or machine.get("cpu_model") or "")
    base = {"nodes": opts.nodes, "pods": opts.pods, "policy": policy, "machine": label}
    out = [
        {
            **base,
            "mode": "extender",
            "pods_per_s": ext_rate,
            "stock_pods_per_s": stock_rate,
            "filter_p99_ms": p99.get("filter"),
            "bind_p99_ms": p99.get("bind"),
            "controller_rss_mib": rss,
            "violations": violations,
        }
    ]
    if dra_rate is not None and dra_alloc is not None:
        out.append(
            {
                **base,
                "mode": "dra",
                "pods_per_s": dra_rate,
                "stock_pods_per_s": stock_rate,
                "filter_p99_ms": None,
                "bind_p99_ms": None,
                "controller_rss_mib": rss,
                "violations": dra_alloc["violations"],
            }
        )
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def write_results(result: dict[str, Any], out: Path) -> tuple[Path, Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path = out.with_suffix(".json")
    md_path = out.with_suffix(".md")
    json_path.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")
    md_path.write_text(render_markdown(result))
    return json_path, md_path


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        opts = parse_args(argv)
        result = asyncio.run(run(opts))
    except InvalidInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except harness.HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    json_path, md_path = write_results(result, opts.out)
    print(render_markdown(result))
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
