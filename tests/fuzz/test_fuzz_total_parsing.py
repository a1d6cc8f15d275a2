"""Parsing is total: hostile inputs through the watch path, the webhook, the extender and the
device plugin's Allocate end as a clear refusal (InvalidInputError, a 4xx body, an
AllocationError), never an uncaught exception; and the controller's view stays synced and
counts correctly while poison objects come through its watch.

In process and deterministic (``tests/fuzz/hostile.py``): ``GPUSHARE_FUZZ_INPUTS`` inputs in all
(default 100,000, a quarter per surface), seed ``GPUSHARE_FUZZ_SEED``. The counts go to
``$GPUSHARE_SECURITY_OUT/fuzz.json`` when set (bench/results/security.json).
"""

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.inventory import GpuInfo
from gpushare.api.names import ANN_FRACTION, RESOURCE_GPU_PERCENT
from gpushare.api.placement import Placement
from gpushare.cluster.extender.args import BadRequestError, parse_binding_args, parse_extender_args
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.server import decode_body
from gpushare.cluster.state.view import ClusterView
from gpushare.cluster.webhook import review as webhook
from gpushare.cluster.webhook.facts import ClusterFacts
from gpushare.kube import informer
from gpushare.node.deviceplugin.allocator import Allocator
from gpushare.node.deviceplugin.pods import PodInfo, pod_info
from gpushare.node.deviceplugin.response import AllocationError
from gpushare.node.mps.manager import MpsManager
from tests.fixtures.builders import GIB, gpu, node_json, pod_json
from tests.fuzz.hostile import GPU_UUIDS, NODES, Hostile

TOTAL = int(os.environ.get("GPUSHARE_FUZZ_INPUTS", "100000"))
PER_SURFACE = max(1, TOTAL // 4)
SEED = int(os.environ.get("GPUSHARE_FUZZ_SEED", "19"))
STATS: dict[str, dict[str, Any]] = {}
CONTROL_GPU = "GPU-control-0000"


class Tally:
    """Inputs tried, refusals, and uncaught exceptions (with a few examples) of one surface."""

    def __init__(self, surface: str) -> None:
        self.surface = surface
        self.inputs = 0
        self.outcomes: Counter[str] = Counter()
        self.uncaught: list[str] = []
        self.started = time.perf_counter()

    def crash(self, exc: BaseException, what: object) -> None:
        self.outcomes["uncaught"] += 1
        if len(self.uncaught) < 5:
            self.uncaught.append(f"{type(exc).__name__}: {str(exc)[:200]} for {str(what)[:200]}")

    def done(self) -> None:
        STATS[self.surface] = {
            "inputs": self.inputs,
            "uncaught": self.outcomes["uncaught"],
            "outcomes": dict(self.outcomes),
            "seconds": round(time.perf_counter() - self.started, 2),
            "examples": self.uncaught,
        }
        assert self.outcomes["uncaught"] == 0, self.uncaught


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
        tally.inputs += 1
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
                view.replace_pods(items)  # a re-list: the same view entry point the informer uses
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
        tally.inputs += 1
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
            doc, verdict = webhook.answer(parsed, facts=facts, mutate=hostile.rng.random() < 0.5)
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

    loop = asyncio.new_event_loop()
    try:
        for _ in range(PER_SURFACE):
            tally.inputs += 1
            verb = rng.choice(["filter", "prioritize", "filter", "bind"])
            body = _safe_body(hostile, binding_doc if verb == "bind" else args_doc)
            try:
                doc = decode_body(body)
                if verb == "bind":
                    result: Any = loop.run_until_complete(extender.bind(parse_binding_args(doc)))
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
        tally.inputs += 1
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
