"""Parsing is total: hostile inputs through the watch path, the webhook, the extender, the
device plugin's Allocate and each tenant-reachable field parser on its own end as a clear
refusal (InvalidInputError, a 4xx body, an AllocationError), never an uncaught exception; and
the controller's view stays synced and counts correctly while poison objects come through its
watch. Each input is timed (none may take 1 s) and its peak memory above the resident set
before it is measured (none may grow it past 64 MiB; Linux's VmHWM, reset per input).

In process and deterministic (``tests/fuzz/hostile.py``): ``GPUSHARE_FUZZ_INPUTS`` inputs in all
(default 20,000 so that ``make test`` stays quick; the benchmark runs 250,000), a sixth per
surface, seed ``GPUSHARE_FUZZ_SEED``. The sixth surface holds issue 67's entry points: HTTP
heads of the extender's and the webhook's server (Content-Encoding, lengths), the admission
process's value count and review parse, the socket pair's arguments, bearer tokens and the
per-client review budget, ResourceQuotas, GpuShare selectors, profile cache entries and DRA
claims as a node agent reads them. The counts go to ``$GPUSHARE_SECURITY_OUT/fuzz.json``
when set (bench/results/security.json).
"""

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.dra import parse_mps_config
from gpushare.api.errors import InvalidInputError
from gpushare.api.exclusive import parse_avoid_gpus
from gpushare.api.gpushare_crd import parse_spec
from gpushare.api.inventory import GpuInfo
from gpushare.api.label_selector import parse_label_selector
from gpushare.api.limit import parse_limit
from gpushare.api.names import (
    ANN_BIND_TIME,
    ANN_CLASS,
    ANN_FRACTION,
    ANN_GPU_UUID,
    ANN_MEMORY_LIMIT,
    ANN_OPPORTUNISTIC,
    ANN_PAUSE,
    ANN_PAUSED,
    ANN_STATE,
    ANN_THREAD_PERCENT,
    ANN_TIER,
    RESOURCE_GPU_OPPORTUNISTIC,
    RESOURCE_GPU_PERCENT,
)
from gpushare.api.placement import Placement, parse_placement
from gpushare.api.pod import PodInfo, pod_info
from gpushare.api.quantities import kube_quantity
from gpushare.api.request import parse_opportunistic, parse_request
from gpushare.cluster import http_head
from gpushare.cluster.admission import link
from gpushare.cluster.admission.child import too_many_values
from gpushare.cluster.extender.args import (
    BadRequestError,
    parse_binding_args,
    parse_extender_args,
    parse_preemption_args,
)
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.operator.cache import cache_key, decode_entry, evictable_keys, lookup
from gpushare.cluster.server import decode_body
from gpushare.cluster.state import gpu_requests, pod_facts
from gpushare.cluster.state.host_resources import pod_requests
from gpushare.cluster.state.quotas import GuaranteeQuotas
from gpushare.cluster.state.view import ClusterView
from gpushare.cluster.webhook import review as webhook
from gpushare.cluster.webhook.facts import ClusterFacts
from gpushare.kube import informer
from gpushare.kube.access import AccessCache, bearer_token
from gpushare.node.core.answer import AllocationError
from gpushare.node.deviceplugin import devices
from gpushare.node.deviceplugin.allocator import Allocator
from gpushare.node.dra.claims import ClaimRef, parse_claim
from gpushare.node.mps.manager import MpsManager
from tests.fixtures.builders import GIB, gpu, node_json, pod_json
from tests.fuzz.hostile import GPU_UUIDS, NODES, QUANTITIES, Hostile
from tests.unit.cluster.webhook.test_webhook_review import review_body
from tests.unit.node.dra.helpers import NODE, claim
from tests.unit.node.dra.test_claims import GPUS as CLAIM_GPUS

TOTAL = int(os.environ.get("GPUSHARE_FUZZ_INPUTS", "20000"))
SURFACES = 6
PER_SURFACE = max(1, -(-TOTAL // SURFACES))
SEED = int(os.environ.get("GPUSHARE_FUZZ_SEED", "19"))
STATS: dict[str, dict[str, Any]] = {}
CONTROL_GPU = "GPU-control-0000"
CLAIM_REF = ClaimRef(namespace="ns", uid="0b1c2d3e-0000-4000-8000-000000000001", name="c1")
SLOW_S = 1.0
"""No input may take this long (issue #45's target)."""
GROWTH_LIMIT_BYTES = 64 * 2**20
"""No input may raise the peak resident set this far above the resident set before it."""


class MemoryProbe:
    """The process's resident set (VmRSS) and its peak (VmHWM) from /proc/self/status; writing
    5 to /proc/self/clear_refs resets the peak (Linux 4.0+), so that the peak after an input is
    that input's own. ``available`` is False elsewhere (the growth then goes unmeasured)."""

    def __init__(self) -> None:
        try:
            self._status = os.open("/proc/self/status", os.O_RDONLY)
            self._clear = os.open("/proc/self/clear_refs", os.O_WRONLY)
            self.reset()
            self.available = True
        except OSError:
            self.available = False

    def reset(self) -> None:
        os.write(self._clear, b"5")

    def read(self) -> tuple[int, int]:
        """(resident, peak) in bytes."""
        text = os.pread(self._status, 8192, 0)
        rss = hwm = 0
        for line in text.split(b"\n"):
            if line.startswith(b"VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith(b"VmHWM:"):
                hwm = int(line.split()[1]) * 1024
        return rss, hwm


PROBE = MemoryProbe()


class Tally:
    """Inputs tried, refusals, uncaught exceptions (with a few examples), the slowest input and
    the largest memory growth of one surface."""

    def __init__(self, surface: str) -> None:
        self.surface = surface
        self.inputs = 0
        self.outcomes: Counter[str] = Counter()
        self.uncaught: list[str] = []
        self.started = time.perf_counter()
        self.slowest_s = 0.0
        self.slow: list[str] = []
        self.max_growth = 0
        self.grown: list[str] = []
        self.rss_start = PROBE.read()[0] if PROBE.available else 0

    @contextmanager
    def input(self, what: Callable[[], object] = lambda: "") -> Iterator[None]:
        """Count one input; time it and measure its memory growth (``what`` names it in the
        examples of a slow or growing input)."""
        self.inputs += 1
        if PROBE.available:
            PROBE.reset()
            before = PROBE.read()[0]
        # CPU time of this thread, not the wall clock: what the input costs the parser, not
        # how busy the host is (on a loaded 2-core machine a descheduled thread read > 1 s).
        start = time.thread_time()
        try:
            yield
        finally:
            took = time.thread_time() - start
            self.slowest_s = max(self.slowest_s, took)
            if took > SLOW_S:
                self.outcomes["slow"] += 1
                if len(self.slow) < 5:
                    self.slow.append(f"{took:.2f}s for {str(what())[:200]}")
            if PROBE.available:
                growth = PROBE.read()[1] - before
                self.max_growth = max(self.max_growth, growth)
                if growth > GROWTH_LIMIT_BYTES:
                    self.outcomes["grew"] += 1
                    if len(self.grown) < 5:
                        self.grown.append(f"{growth / 2**20:.0f} MiB for {str(what())[:200]}")

    def crash(self, exc: BaseException, what: object) -> None:
        self.outcomes["uncaught"] += 1
        if len(self.uncaught) < 5:
            self.uncaught.append(f"{type(exc).__name__}: {str(exc)[:200]} for {str(what)[:200]}")

    def done(self) -> None:
        rss_end = PROBE.read()[0] if PROBE.available else 0
        STATS[self.surface] = {
            "inputs": self.inputs,
            "uncaught": self.outcomes["uncaught"],
            "outcomes": dict(self.outcomes),
            "seconds": round(time.perf_counter() - self.started, 2),
            "examples": self.uncaught,
            "slowest_input_s": round(self.slowest_s, 4),
            "over_1s": self.outcomes["slow"],
            "slow_examples": self.slow,
            "memory_measured": PROBE.available,
            "max_input_growth_mib": round(self.max_growth / 2**20, 2),
            "over_64mib": self.outcomes["grew"],
            "growth_examples": self.grown,
            "surface_rss_growth_mib": round((rss_end - self.rss_start) / 2**20, 2),
        }
        assert self.outcomes["uncaught"] == 0, self.uncaught
        assert self.outcomes["slow"] == 0, self.slow
        assert self.outcomes["grew"] == 0, self.grown


# ---- the watch path ----------------------------------------------------------------------


def control_pod(name: str, percent: int) -> dict[str, Any]:
    placement = Placement(
        gpu_uuids=(CONTROL_GPU,),
        thread_percent=percent,
        memory_limit_bytes=GIB,
        bind_time=__import__("datetime").datetime.now(__import__("datetime").UTC),
        state="allocated",
    )
    return pod_json(
        name,
        namespace="control",
        fraction=f"{percent / 100:.2f}",
        node="ctl",
        placement=placement,
        phase="Running",
    )


def test_watch_path_takes_every_hostile_object_and_the_view_stays_synced() -> None:
    """Every event goes through the informer's own dispatcher (informer.apply_event) into a live
    view; interleaved control pods on a control node must be counted exactly throughout."""
    tally = Tally("watch")
    hostile = Hostile(SEED)
    view = ClusterView()
    view.replace_nodes([node_json("ctl", [gpu(CONTROL_GPU)]), *(hostile.node(n) for n in NODES)])
    view.replace_pods([])
    before = {k: informer.poisoned_events(k) for k in ("Pod", "Node")}
    live: dict[str, int] = {}
    rng = hostile.rng

    def pod_event(event: str, obj: Mapping[str, Any]) -> None:
        informer.apply_event("Pod", event, obj, upsert=view.upsert_pod, delete=delete_pod)

    def delete_pod(obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata", {})
        view.delete_pod(f"{meta.get('namespace', 'default')}/{meta.get('name', '')}")

    def delete_node(obj: Mapping[str, Any]) -> None:
        view.delete_node(str(obj.get("metadata", {}).get("name", "")))

    for i in range(PER_SURFACE):
        with tally.input():
            roll = rng.random()
            if roll < 0.6:
                pod_event(rng.choice(["ADDED", "MODIFIED", "MODIFIED"]), hostile.pod())
            elif roll < 0.7:
                pod_event("DELETED", hostile.pod())
            elif roll < 0.85:
                informer.apply_event(
                    "Node",
                    "MODIFIED",
                    hostile.node(rng.choice(NODES)),
                    upsert=view.upsert_node,
                    delete=delete_node,
                )
            elif roll < 0.86:
                items = [hostile.pod() for _ in range(rng.randint(0, 20))]
                items += [control_pod(name, pct) for name, pct in live.items()]
                try:
                    view.replace_pods(
                        items
                    )  # a re-list: the same view entry point the informer uses
                    tally.outcomes["relisted"] += 1
                except Exception as exc:
                    tally.crash(exc, "replace_pods")
            else:
                # control traffic: add or remove a known pod on the control GPU
                name = f"c{rng.randint(0, 6)}"
                if name in live and rng.random() < 0.5:
                    pod_event("DELETED", control_pod(name, live.pop(name)))
                elif name not in live and sum(live.values()) <= 80:
                    live[name] = rng.choice([5, 10, 20])
                    pod_event("ADDED", control_pod(name, live[name]))
                control = view.gpu(CONTROL_GPU)
                assert control is not None, "the control node left the view"
                assert control.used_percent == sum(live.values()), (i, control.tenants, live)
            if i % 5000 == 0:
                assert view.synced
    for k, count in before.items():
        skipped = informer.poisoned_events(k) - count
        if skipped:
            tally.crash(RuntimeError(f"{skipped} {k} events skipped by the watch"), k)
    for held in view.quarantine.held():  # parsing is total: the backstop never catches
        tally.crash(RuntimeError(f"held out: {held.error}"), held.key)
    tally.outcomes["events"] = tally.inputs
    assert view.synced
    tally.done()


# ---- the webhook -------------------------------------------------------------------------


def _review(hostile: Hostile) -> dict[str, Any]:
    rng = hostile.rng
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"u{rng.randint(0, 99)}",
            "kind": {"kind": "Pod"},
            "operation": rng.choice(["CREATE", "CREATE", "UPDATE"]),
            "namespace": "team",
            "object": hostile.pod(),
            "oldObject": hostile.pod(),
        },
    }


def test_webhook_answers_every_hostile_review_or_refuses_it() -> None:
    tally = Tally("webhook")
    hostile = Hostile(SEED + 1)
    facts = ClusterFacts(max_gpu_memory=80 * GIB, max_gpus_per_node=8)
    for _ in range(PER_SURFACE):
        with tally.input():
            body = _safe_body(hostile, lambda: _review(hostile))
            try:
                parsed = webhook.parse_review(body)
            except webhook.BadReviewError:
                tally.outcomes["bad_request"] += 1
                continue
            except Exception as exc:
                tally.crash(exc, body[:200])
                continue
            try:
                doc, verdict = webhook.answer(
                    parsed, facts=facts, mutate=hostile.rng.random() < 0.5
                )
                json.dumps(doc)
            except Exception as exc:
                tally.crash(exc, body[:200])
                continue
            response = doc["response"]
            assert response["uid"] == parsed.uid
            if not verdict.allowed:
                assert response["status"]["message"].startswith("gpushare: ")
            tally.outcomes["allowed" if verdict.allowed else "denied"] += 1
    tally.done()


def _safe_body(hostile: Hostile, valid: Any) -> bytes:
    try:
        return hostile.body(valid)
    except (RecursionError, ValueError):
        return b"[" * 5000


# ---- the extender ------------------------------------------------------------------------


class HostileApi:
    """The API answers for bind: whatever pod the fuzz put there (the input, not a stand-in
    for a decision), and Bindings recorded as accepted."""

    def __init__(self, hostile: Hostile) -> None:
        self.hostile = hostile
        self.bound = 0

    async def get_pod(self, *, namespace: str, name: str) -> dict[str, Any]:
        return self.hostile.pod(name=name, namespace=namespace)

    async def bind_pod(self, **_: Any) -> None:
        self.bound += 1


def test_extender_answers_every_hostile_call_or_refuses_it() -> None:
    tally = Tally("extender")
    hostile = Hostile(SEED + 2)
    rng = hostile.rng
    view = ClusterView()
    view.replace_nodes(
        [
            node_json("n0", [gpu(GPU_UUIDS[0]), gpu(GPU_UUIDS[1], index=1)]),
            node_json("n1", [gpu(GPU_UUIDS[2])]),
        ]
    )
    view.replace_pods([pod_json("t", fraction="0.5", node="n0")])
    api = HostileApi(hostile)
    extender = Extender(view=view, writer=api, gate_seconds=0.001, hold_in_filter=True)

    def args_doc() -> Any:
        return {
            "Pod": hostile.pod(),
            "NodeNames": rng.sample([*NODES, hostile.text()], rng.randint(0, 3)),
        }

    def binding_doc() -> Any:
        return {
            "PodName": f"p{rng.randint(0, 200)}",
            "PodNamespace": rng.choice(["team", hostile.text()]),
            "PodUID": rng.choice(["", hostile.text()]),
            "Node": rng.choice([*NODES, hostile.text()]),
        }

    def preemption_doc() -> Any:
        victims = {
            rng.choice([*NODES, hostile.text()]): {
                "Pods": [{"UID": rng.choice(["uid-default-t", hostile.text()])}],
                "NumPDBViolations": rng.randint(0, 2),
            }
            for _ in range(rng.randint(0, 3))
        }
        return {"Pod": hostile.pod(), "NodeNameToMetaVictims": victims}

    docs = {"bind": binding_doc, "preempt": preemption_doc}
    loop = asyncio.new_event_loop()
    try:
        for _ in range(PER_SURFACE):
            with tally.input():
                verb = rng.choice(["filter", "prioritize", "filter", "bind", "preempt"])
                body = _safe_body(hostile, docs.get(verb, args_doc))
                try:
                    doc = decode_body(body)
                    if verb == "preempt":
                        result: Any = extender.preempt(parse_preemption_args(doc))
                        assert set(result) == {"NodeNameToMetaVictims"}
                    elif verb == "bind":
                        result = loop.run_until_complete(extender.bind(parse_binding_args(doc)))
                        assert set(result) == {"Error"}
                    elif verb == "filter":
                        result = extender.filter(parse_extender_args(doc))
                        assert "%" not in json.dumps(result["FailedNodes"])
                    else:
                        result = extender.prioritize(parse_extender_args(doc))
                        assert all(0 <= h["Score"] <= 10 for h in result)
                    tally.outcomes[f"{verb}_answered"] += 1
                except BadRequestError:
                    tally.outcomes["bad_request"] += 1
                except Exception as exc:
                    tally.crash(exc, body[:200])
                if rng.random() < 0.01:
                    view.expire_holds(now=time.monotonic() + 3600)
    finally:
        loop.close()
    tally.outcomes["binds_posted"] = api.bound
    tally.done()


# ---- the device plugin -------------------------------------------------------------------


class HostilePods:
    """The node's pods as the API server would list them: hostile annotation values (any
    string) and quantities, turned into PodInfo by the node agent's own pod_info."""

    def __init__(self, hostile: Hostile) -> None:
        self.hostile = hostile
        self.tally: Tally | None = None

    def manifest(self) -> dict[str, Any]:
        pod = self.hostile.pod(namespace="team")
        meta = pod["metadata"]
        if not isinstance(meta.get("annotations"), dict):
            meta["annotations"] = {}
        meta["annotations"] = {
            k: v if isinstance(v, str) else self.hostile.text()
            for k, v in meta["annotations"].items()
        }
        if not isinstance(pod["spec"], dict):
            pod["spec"] = {"containers": [{"name": "main"}]}
        for c in pod["spec"].get("containers", []):
            limits = (
                (c.get("resources") or {}).get("limits")
                if isinstance(c.get("resources"), dict)
                else None
            )
            if isinstance(limits, dict) and RESOURCE_GPU_PERCENT in limits:
                limits[RESOURCE_GPU_PERCENT] = str(limits[RESOURCE_GPU_PERCENT])[:100]
            elif "resources" in c and not isinstance(c["resources"], dict):
                del c["resources"]
        pod["status"] = {"phase": self.hostile.rng.choice(["Pending", "Running"])}
        pod["spec"]["nodeName"] = "n0"
        return pod

    def list_node_pods(self) -> list[PodInfo]:
        out = []
        for _ in range(self.hostile.rng.randint(0, 6)):
            manifest = self.manifest()
            out.append(pod_info(manifest))
        return out

    def mark_allocated(self, pod: PodInfo) -> None:
        pass

    def annotate_pod(self, *, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        pass

    def record_event(
        self, *, pod: PodInfo | None, reason: str, message: str, warning: bool
    ) -> None:
        pass


def test_allocate_answers_every_hostile_call_or_refuses_it(tmp_path: Path) -> None:
    tally = Tally("allocate")
    hostile = Hostile(SEED + 3)
    gpus: Sequence[GpuInfo] = [gpu(u, index=i) for i, u in enumerate(GPU_UUIDS)]
    allocator = Allocator(
        node_name="n0",
        gpus=lambda: gpus,
        pods=HostilePods(hostile),
        mps=MpsManager(root=tmp_path, simulated=True),
        retry_delays_s=(),
    )
    for _ in range(PER_SURFACE):
        with tally.input():
            requests = [hostile.device_ids() for _ in range(hostile.rng.randint(1, 2))]
            try:
                answers = allocator.allocate(requests)
                assert all(isinstance(a.envs, dict) for a in answers)
                tally.outcomes["answered"] += 1
            except AllocationError:
                tally.outcomes["refused"] += 1
            except Exception as exc:
                tally.crash(exc, requests)
    tally.done()


# ---- each tenant-reachable field parser on its own --------------------------------------


def _schema_pod(hostile: Hostile) -> dict[str, Any]:
    """A pod as the API server stores it (strings where its schema wants strings, quantities
    that parse as Kubernetes quantities), with hostile values wherever a tenant may write any:
    what the node agent's pod_info and the controller's pod reads get from a list."""
    pod = hostile.pod()
    meta = pod["metadata"]
    raw = meta.get("annotations")
    meta["annotations"] = {
        str(k): v if isinstance(v, str) else hostile.text()
        for k, v in (raw.items() if isinstance(raw, dict) else ())
    }
    meta.pop("labels", None)
    meta.pop("ownerReferences", None)
    meta["creationTimestamp"] = "2026-01-01T00:00:00Z"
    spec = pod["spec"] if isinstance(pod["spec"], dict) else {}
    containers = []
    for i, c in enumerate(spec.get("containers") or [{"name": "main"}]):
        resources = c.get("resources") if isinstance(c.get("resources"), dict) else {}
        kept = {
            kind: {str(r): hostile.rng.choice(QUANTITIES) for r in values}
            for kind, values in resources.items()
            if kind in ("limits", "requests") and isinstance(values, dict)
        }
        containers.append({"name": f"c{i}", "resources": kept})
    pod["spec"] = {"containers": containers, "nodeName": "n0"}
    return pod


def _fields_input(hostile: Hostile) -> tuple[str, Callable[[], object]]:
    """One call of one parser with a hostile argument: (its name, the call)."""
    rng = hostile.rng
    which = rng.randrange(13)
    if which == 0:
        ids = hostile.device_ids()
        return "parse_device_id", lambda: [devices.parse_device_id(v) for v in ids]
    if which == 1:
        ids = hostile.device_ids()
        return "group_by_gpu", lambda: (devices.group_by_gpu(ids), devices.capacity_of(ids))
    if which == 2:
        value = hostile.text() if rng.random() < 0.8 else rng.choice(["true", "FALSE", " True "])
        return "parse_opportunistic", lambda: parse_opportunistic(value)
    if which == 3:
        ann = {k: v if isinstance(v, str) else "" for k, v in hostile.annotations().items()}
        if rng.random() < 0.5:
            ann[ANN_OPPORTUNISTIC] = rng.choice(["true", "false", hostile.text()])
        if rng.random() < 0.3:
            ann[ANN_CLASS] = rng.choice(["latency", "batch", hostile.text()])
        return "parse_request", lambda: parse_request(ann)
    if which == 4:
        ann = {
            ANN_GPU_UUID: rng.choice([*GPU_UUIDS, hostile.text()]),
            ANN_THREAD_PERCENT: rng.choice(["25", hostile.text()]),
            ANN_MEMORY_LIMIT: rng.choice([str(GIB), hostile.text()]),
            ANN_BIND_TIME: rng.choice(["2026-01-01T00:00:00Z", hostile.text()]),
            ANN_STATE: rng.choice(["assumed", "allocated", hostile.text()]),
            ANN_TIER: rng.choice(["guaranteed", "opportunistic", hostile.text()]),
        }
        return "parse_placement", lambda: parse_placement(ann)
    if which == 5:
        value = hostile.quantity()
        milli = rng.random() < 0.5
        return "kube_quantity", lambda: kube_quantity(value, milli=milli)
    if which == 6:
        pod = hostile.pod()
        return "pod_requests", lambda: pod_requests(pod)
    if which == 7:
        pod = hostile.pod()
        meta = pod.get("metadata") if isinstance(pod, dict) else None
        if isinstance(meta, dict) and isinstance(meta.get("annotations"), dict):
            # The pause request and state: only gpushare writes them, and a watch never fails.
            for key in (ANN_PAUSE, ANN_PAUSED):
                if rng.random() < 0.5:
                    meta["annotations"][key] = hostile.text()
        return "pod_facts", lambda: (
            pod_facts.facts(pod),
            gpu_requests.gpu_resource(pod),
            gpu_requests.gpu_percent_resource(pod, RESOURCE_GPU_OPPORTUNISTIC),
        )
    if which == 8:
        pod = _schema_pod(hostile)
        return "node_pod_info", lambda: pod_info(pod)
    if which == 9:
        value = hostile.text()
        return "parse_avoid_gpus", lambda: parse_avoid_gpus(value)
    if which == 10:
        value = hostile.text()
        return "parse_limit", lambda: parse_limit(value)
    if which == 11:
        spec = {
            k: hostile.value()
            for k in rng.sample(
                ["fraction", "memory", "class", "limit", "opportunistic", "selector", "packing"],
                rng.randint(1, 4),
            )
        }
        return "gpushare_spec", lambda: parse_spec(spec)
    params = rng.choice(
        [
            hostile.value(),
            {
                "apiVersion": "gpu.gpushare.io/v1alpha1",
                "kind": "MpsConfig",
                "class": hostile.value(),
                "limit": hostile.value(),
            },
        ]
    )
    return "dra_mps_config", lambda: parse_mps_config(params, field="config")


def test_each_tenant_reachable_field_parser_is_total() -> None:
    """Device IDs the kubelet passes (``<UUID>::NN``, ``<UUID>::oNNN``), the opportunistic
    opt-in, placement annotations with the tier, quantities of every kind, the node agent's
    pod read, avoid-gpus, gpu-limit, GpuShare specs and DRA claim parameters: each returns or
    raises InvalidInputError naming a field."""
    tally = Tally("fields")
    hostile = Hostile(SEED + 4)
    for _ in range(PER_SURFACE):
        name, call = _fields_input(hostile)
        with tally.input(lambda name=name: name):
            try:
                call()
                tally.outcomes[f"{name}_answered"] += 1
            except InvalidInputError as exc:
                assert exc.field, name
                tally.outcomes[f"{name}_refused"] += 1
            except Exception as exc:
                tally.crash(exc, name)
    tally.done()


# ---- issue 67's entry points -----------------------------------------------------------


def _head(hostile: Hostile) -> bytes:
    """An HTTP request head: mostly well formed, with hostile lengths and encodings."""
    rng = hostile.rng
    lines = [rng.choice(["POST /mutate HTTP/1.1", "GET /metrics HTTP/1.0", hostile.text()])]
    for _ in range(rng.randint(0, 6)):
        name = rng.choice(
            ["Content-Length", "Content-Encoding", "Transfer-Encoding", "Connection", "Expect"]
        )
        value = rng.choice(["gzip", "identity", "0", "4194305", "-1", "close", hostile.text()])
        lines.append(f"{name}: {value}" if rng.random() < 0.9 else hostile.text())
    return "\r\n".join(lines).encode("utf-8", "surrogatepass")


def _round_three_input(hostile: Hostile) -> tuple[str, Callable[[], object]]:
    rng = hostile.rng
    which = rng.randrange(9)
    if which == 0:
        raw = _head(hostile)
        return "http_head", lambda: http_head.parse_head(raw, len(raw) + 4, 4 * 2**20)
    if which == 1:
        body = hostile.body(lambda: json.loads(webhook_body()))
        return "admission_review", lambda: (
            too_many_values(body),
            webhook.parse_review(body) if too_many_values(body) is None else None,
        )
    if which == 2:
        args = hostile.value() if rng.random() < 0.5 else [hostile.value() for _ in range(3)]
        return "link_args", lambda: link.plain_args(args)
    if which == 3:
        header = rng.choice([f"Bearer {hostile.text()}", hostile.text(), None, "Bearer a.b.c"])
        cache = AccessCache()
        return "bearer_token", lambda: (
            bearer_token(header),
            cache.spend(AccessCache.key(str(header), "/metrics", "get"), hostile.text()),
        )
    if which == 4:
        quota = {
            "metadata": rng.choice(
                [{"name": "q", "namespace": "t"}, hostile.value(), {"name": hostile.value()}]
            ),
            "spec": rng.choice(
                [
                    {"hard": {"requests.gpushare.io/gpu-percent": hostile.quantity()}},
                    hostile.value(),
                ]
            ),
        }
        quotas = GuaranteeQuotas()
        return "resource_quota", lambda: (quotas.upsert(quota), quotas.replace([quota, quota]))
    if which == 5:
        selector = rng.choice(
            [
                hostile.value(),
                {"matchLabels": hostile.value()},
                {
                    "matchExpressions": [
                        {"key": hostile.text(), "operator": "In", "values": hostile.value()}
                    ]
                },
                {"matchExpressions": hostile.value()},
            ]
        )
        return "label_selector", lambda: parse_label_selector(selector)
    if which == 6:
        text = rng.choice([hostile.text(), _as_json(hostile.value()), "[" * 50_000])
        key = cache_key(image="i", command=["c"], gpu_model="m", tenancy="t")
        return "profile_cache", lambda: (
            decode_entry(text),
            lookup({key: text}, image="i", command=["c"], gpu_models=["m"], tenancy="t"),
            evictable_keys({key: text, "profile-x": text}, keep=1, per_tenancy=1),
        )
    manifest = claim(consumed={"gpuPercent": "10"})
    for _ in range(rng.randint(1, 3)):
        where = rng.choice(["status", "metadata", "allocation", "results", "reservedFor"])
        if where in ("status", "metadata"):
            manifest[where] = hostile.value()
        elif isinstance(manifest.get("status"), dict):
            status = manifest["status"]
            if where == "reservedFor":
                status["reservedFor"] = rng.choice(
                    [hostile.value(), [hostile.value()], [{"resource": "pods"}] * 8]
                )
            elif where == "allocation":
                status["allocation"] = hostile.value()
            elif isinstance(status.get("allocation"), dict):
                status["allocation"]["devices"] = {"results": [hostile.value()]}
    return "dra_claim", lambda: parse_claim(manifest, ref=CLAIM_REF, pool=NODE, gpus=CLAIM_GPUS)


def _as_json(value: object) -> str:
    try:
        return json.dumps(value, default=str)
    except (RecursionError, ValueError):
        return "[" * 5000  # nested past what the encoder takes: as deep as a text


def webhook_body() -> bytes:
    return review_body(pod_json("p", fraction="0.5"))


def test_issue_67_entry_points_are_total() -> None:
    """Each of issue 67's entry points returns or refuses naming the field (a 4xx answer,
    InvalidInputError, BadReviewError, LinkError), never an uncaught exception: 228 of the
    last round's uncaught inputs were an undecodable Content-Encoding, 98 DRA claim shapes,
    38 a deeply nested profile cache value."""
    tally = Tally("issue67")
    hostile = Hostile(SEED + 5)
    refusals = (
        InvalidInputError,
        webhook.BadReviewError,
        link.LinkError,
        http_head.RefusedError,
    )
    for _ in range(PER_SURFACE):
        name, call = _round_three_input(hostile)
        with tally.input(lambda name=name: name):
            try:
                call()
                tally.outcomes[f"{name}_answered"] += 1
            except refusals:
                tally.outcomes[f"{name}_refused"] += 1
            except Exception as exc:
                tally.crash(exc, name)
    tally.done()


@pytest.fixture(scope="module", autouse=True)
def publish() -> Iterator[None]:
    yield
    out = os.environ.get("GPUSHARE_SECURITY_OUT")
    if out and STATS:
        path = Path(out) / "fuzz.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "seed": SEED,
            "fuzz_inputs": sum(s["inputs"] for s in STATS.values()),
            "fuzz_uncaught": sum(s["uncaught"] for s in STATS.values()),
            "surfaces": STATS,
        }
        path.write_text(json.dumps(doc, indent=2))


__all__ = ["ANN_FRACTION"]
