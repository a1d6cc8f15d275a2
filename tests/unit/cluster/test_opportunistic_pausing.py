"""The controller's side of "pause, don't kill" (docs/packing.md, "The sharing contract"): a
guaranteed pod's bind writes ``gpushare.io/pause`` on the opportunistic pod whose compute it
needs before its Binding, with a ``Paused`` Event naming it; the paused pod keeps its memory in
the view; it is resumed (annotation removed, ``Resumed`` Event) when the guaranteed pod leaves,
also by a leader that did not pause it; memory no pause frees evicts with a ``Preempted`` Event
saying so; two opted-in pods never preempt each other; the governor's harm verdict pauses; a
latency pod pauses an opportunistic pod running over the cap its neighbours get."""

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpushare.api.gpushare_crd import ANN_PROFILE
from gpushare.api.names import (
    ANN_CLASS,
    ANN_PAUSE,
    ANN_PAUSED,
    CLASS_LATENCY,
    RESOURCE_GPU_OPPORTUNISTIC,
    RESOURCE_GPU_PERCENT,
    STATE_ALLOCATED,
    TIER_GUARANTEED,
    TIER_OPPORTUNISTIC,
)
from gpushare.api.pause import REASON_GUARANTEED, REASON_HARM, PauseState, load_pause_request
from gpushare.api.placement import Placement
from gpushare.api.profile import GpuProfile
from gpushare.cluster.extender.args import BindingArgs, parse_extender_args
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.metrics import Metrics
from gpushare.cluster.opportunistic import OpportunisticDuties
from gpushare.cluster.state.view import ClusterView
from gpushare.packing.admission import Admission
from gpushare.packing.opportunistic import Opportunism
from tests.fixtures.builders import GIB, PodStore, gpu, node_json, pod_json

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
MODEL = "NVIDIA H100 80GB HBM3"
# Solo profiles measured on an H100 by the GPU benchmark (run 20), as a GpuShare stores them.
SMALL = GpuProfile(
    gpu_model=MODEL, fp32=0.007, tensor=0.022, sm_occupancy=0.06, dram_bandwidth=0.05,
    sm_utilization=0.19, fp16=0.0, fp64=0.0,
)  # fmt: skip
BIG = GpuProfile(
    gpu_model=MODEL, fp32=0.02, tensor=0.25, sm_occupancy=0.41, dram_bandwidth=0.48,
    sm_utilization=0.79, fp16=0.0, fp64=0.0,
)  # fmt: skip
GEMM = GpuProfile(
    gpu_model=MODEL, fp32=0.0, tensor=0.96, sm_occupancy=0.12, dram_bandwidth=0.15,
    sm_utilization=0.98, fp16=0.0, fp64=0.0,
)  # fmt: skip


def profiled(profile: GpuProfile) -> dict[str, str]:
    status = profile.stored(now=NOW).to_status()
    return {ANN_PROFILE: json.dumps(status, separators=(",", ":"))}


def asking(resource: str, percent: int) -> list[dict[str, Any]]:
    amount = {resource: str(percent)}
    return [{"name": "main", "image": "busybox", "resources": {"limits": amount}}]


def placed(
    name: str,
    percent: int,
    profile: GpuProfile,
    *,
    tier: str = TIER_GUARANTEED,
    gib: int = 10,
    threads: int | None = None,
) -> dict[str, Any]:
    """A running pod on GPU G0 of node n with a ``gib`` GiB memory cap, capped at ``threads``
    (its request when None; opportunistic pods at the whole GPU)."""
    opportunistic = tier == TIER_OPPORTUNISTIC
    resource = RESOURCE_GPU_OPPORTUNISTIC if opportunistic else RESOURCE_GPU_PERCENT
    cap = threads or (100 if opportunistic else percent)
    placement = Placement(("G0",), cap, gib * GIB, NOW, STATE_ALLOCATED, percent, tier)
    return pod_json(
        name,
        node="n",
        placement=placement,
        phase="Running",
        annotations=profiled(profile),
        containers=asking(resource, percent),
        scheduled=True,
    )


def pending(name: str, percent: int, profile: GpuProfile, *, opted_in: bool = False) -> Any:
    resource = RESOURCE_GPU_OPPORTUNISTIC if opted_in else RESOURCE_GPU_PERCENT
    return pod_json(
        name,
        annotations=profiled(profile),
        containers=asking(resource, percent),
        scheduled=True,
    )


class Cluster:
    """A view, the in-memory API it reads back as a watch would, the extender and the
    leader's opportunistic duties over them."""

    def __init__(self, *pods: dict[str, Any], clock: float = NOW.timestamp()) -> None:
        self.view = ClusterView(clock=lambda: NOW)
        self.view.replace_nodes([node_json("n", [gpu("G0")])])
        self.store = PodStore()
        for pod in pods:
            self.store.add(pod)
        self.view.replace_pods([dict(p) for p in self.store.pods.values()])
        self.view.mark_synced()
        self.store.watchers.append(self.view.upsert_pod)
        self.opportunism = Opportunism()
        self.metrics = Metrics(self.view)
        self.now = clock
        self.duties = OpportunisticDuties(
            view=self.view,
            kube=self.store,  # type: ignore[arg-type]
            opportunism=self.opportunism,
            metrics=self.metrics,
            period_s=30.0,
            settle_s=60.0,
            agent_url="http://{node_ip}:9400",
            clock=lambda: self.now,
            waiting=lambda: self.extender.refused.waiting(self.view.pods()),
        )
        self.extender = Extender(
            view=self.view,
            writer=self.store,
            admission=Admission(),
            opportunism=self.opportunism,
        )
        self.extender.pauser = self.duties.pause_for
        self.extender.bound_listeners.append(self.duties.bound)

    def refuse(self, pod: dict[str, Any]) -> list[str]:
        """The scheduler's filter alone for ``pod`` (created a minute before NOW); the nodes
        it passed."""
        pod["metadata"]["creationTimestamp"] = "2026-01-01T11:59:00Z"
        self.store.add(pod)
        self.view.upsert_pod(pod)
        result = self.extender.filter(parse_extender_args({"Pod": pod, "NodeNames": ["n"]}))
        return list(result.get("NodeNames") or [])

    async def schedule(self, pod: dict[str, Any]) -> str:
        """The scheduler's filter then bind for ``pod`` on node n; the bind's error."""
        self.store.add(pod)
        self.view.upsert_pod(pod)
        self.extender.filter(parse_extender_args({"Pod": pod, "NodeNames": ["n"]}))
        meta = pod["metadata"]
        args = BindingArgs(meta["name"], meta["namespace"], meta["uid"], "n")
        error = (await self.extender.bind(args))["Error"]
        await asyncio.sleep(0)  # let the spawned Events go out
        return error

    def delete(self, key: str) -> None:
        del self.store.pods[key]
        self.view.delete_pod(key)

    def tenant(self, key: str) -> Any:
        g = self.view.gpu("G0")
        assert g is not None
        return next(t for t in g.tenants if t.key == key)

    def annotations(self, key: str) -> dict[str, str]:
        return dict(self.store.pods[key]["metadata"]["annotations"])

    def counted(self, event: str, reason: str = "") -> float:
        text = generate_latest(self.metrics.registry).decode()
        return sum(
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "gpushare_opportunistic_events_total"
            and s.labels == {"event": event, "reason": reason}
        )


def test_a_guaranteed_pod_pauses_the_opportunistic_pod_before_it_is_bound_then_resumes_it() -> None:
    async def scenario() -> None:
        c = Cluster(
            placed("a", 20, SMALL), placed("gemm", 60, GEMM, tier=TIER_OPPORTUNISTIC, threads=60)
        )
        assert await c.schedule(pending("big", 60, BIG)) == ""
        # The pause request went out before the Binding, naming who needs the room.
        calls = [call for call in c.store.calls if call[0] in ("pause", "bind")]
        assert calls == [("pause", "default/gemm"), ("bind", "default/big")]
        request = load_pause_request(c.annotations("default/gemm")[ANN_PAUSE])
        assert request.reason == REASON_GUARANTEED and request.for_pods == ("default/big",)
        paused = [e for e in c.store.events if e[1] == "Paused"]
        assert len(paused) == 1 and paused[0][0] == "default/gemm"
        assert "default/big" in paused[0][2] and "keeps its GPU memory" in paused[0][2]
        # Paused, it keeps its memory in the view; nothing was evicted.
        gemm = c.tenant("default/gemm")
        assert gemm.paused and gemm.memory_bytes == 10 * GIB
        assert not any(call[0] == "evict" for call in c.store.calls)
        assert c.counted("paused", REASON_GUARANTEED) == 1.0
        # While the guaranteed pod runs, no round resumes it.
        assert await c.duties.resume_round() == []
        # It leaves, but the GEMM would slow the guaranteed 20% pod below 0.9 of what its
        # share alone gives it (share_floor: 0.65 against 0.70), so it stays paused...
        c.delete("default/big")
        assert await c.duties.resume_round() == []
        assert c.tenant("default/gemm").paused
        # ...until that pod leaves too: the next round resumes the GEMM.
        c.delete("default/a")
        assert await c.duties.resume_round() == ["default/gemm"]
        assert ANN_PAUSE not in c.annotations("default/gemm")
        assert not c.tenant("default/gemm").paused
        assert [e[0] for e in c.store.events if e[1] == "Resumed"] == ["default/gemm"]
        assert c.counted("resumed") == 1.0

    asyncio.run(scenario())


def test_a_latency_pod_pauses_the_opportunistic_pod_running_over_its_neighbours_cap() -> None:
    # The opted-in SMALL pod started before any latency pod, uncapped; MPS keeps that cap, so
    # the service's bind pauses it (a batch pod would not), and it resumes once the service
    # has left.
    async def scenario() -> None:
        c = Cluster(
            placed("a", 20, SMALL), placed("wide", 30, SMALL, tier=TIER_OPPORTUNISTIC, threads=100)
        )
        service = pending("svc", 25, SMALL)
        service["metadata"]["annotations"][ANN_CLASS] = CLASS_LATENCY
        assert await c.schedule(service) == ""
        calls = [call for call in c.store.calls if call[0] in ("pause", "bind")]
        assert calls == [("pause", "default/wide"), ("bind", "default/svc")]
        request = load_pause_request(c.annotations("default/wide")[ANN_PAUSE])
        assert request.for_pods == ("default/svc",)
        assert await c.duties.resume_round() == []
        c.delete("default/svc")
        assert await c.duties.resume_round() == ["default/wide"]

    asyncio.run(scenario())
    # The same pod as a batch pod pauses nobody.
    batch = Cluster(
        placed("a", 20, SMALL), placed("wide", 30, SMALL, tier=TIER_OPPORTUNISTIC, threads=100)
    )
    assert asyncio.run(batch.schedule(pending("b", 25, SMALL))) == ""
    assert not any(call[0] in ("pause", "evict") for call in batch.store.calls)


def test_a_new_leader_resumes_a_pod_its_predecessor_paused_once_room_is_free() -> None:
    async def scenario() -> None:
        c = Cluster(
            placed("a", 20, SMALL), placed("gemm", 60, GEMM, tier=TIER_OPPORTUNISTIC, threads=60)
        )
        assert await c.schedule(pending("big", 60, BIG)) == ""
        c.delete("default/big")
        c.delete("default/a")  # beside it the GEMM stays paused (share_floor)
        # Another replica takes over: its view is built from the annotations alone.
        successor = Cluster(*(dict(p) for p in c.store.pods.values()))
        assert successor.tenant("default/gemm").paused
        assert await successor.duties.resume_round() == ["default/gemm"]
        assert ANN_PAUSE not in successor.annotations("default/gemm")

    asyncio.run(scenario())


def test_a_guaranteed_pod_short_of_memory_evicts_saying_it_was_for_memory() -> None:
    async def scenario() -> None:
        c = Cluster(
            placed("a", 30, SMALL, gib=24),
            placed("hog", 50, SMALL, tier=TIER_OPPORTUNISTIC, gib=40),
        )
        assert await c.schedule(pending("g", 60, SMALL)) == ""
        await asyncio.sleep(0.01)
        assert ("evict", "default/hog") in c.store.calls
        assert ANN_PAUSE not in c.annotations("default/hog")
        ((key, _, message),) = [e for e in c.store.events if e[1] == "Preempted"]
        assert key == "default/hog" and "GPU memory" in message and "default/g" in message
        assert c.counted("evicted", "memory") == 1.0

    asyncio.run(scenario())


def test_an_opted_in_pod_never_pauses_an_opportunistic_one() -> None:
    async def scenario() -> None:
        c = Cluster(
            placed("a", 20, SMALL), placed("gemm", 60, GEMM, tier=TIER_OPPORTUNISTIC, threads=60)
        )
        await c.schedule(pending("big", 60, BIG, opted_in=True))
        assert ANN_PAUSE not in c.annotations("default/gemm")
        assert not any(call[0] in ("pause", "evict") for call in c.store.calls)

    asyncio.run(scenario())


def test_a_failed_pause_write_refuses_the_bind_and_the_pod_counts_as_running() -> None:
    async def scenario() -> None:
        c = Cluster(
            placed("a", 20, SMALL), placed("gemm", 60, GEMM, tier=TIER_OPPORTUNISTIC, threads=60)
        )

        async def refused(**_: object) -> None:
            raise RuntimeError("API server unavailable")

        c.store.request_pause = refused  # type: ignore[method-assign]
        error = await c.schedule(pending("big", 60, BIG))
        assert "could not pause" in error and "retried" in error
        assert "nodeName" not in c.store.pods["default/big"]["spec"]
        assert not c.tenant("default/gemm").paused

    asyncio.run(scenario())


def test_the_governors_harm_verdict_pauses_naming_the_harmed_pod() -> None:
    async def scenario() -> None:
        c = Cluster(placed("big", 60, BIG), placed("opp", 30, SMALL, tier=TIER_OPPORTUNISTIC))
        c.now = NOW.timestamp() + 3600

        class Reader:
            """The node agent's /profile: the GPU doing a tenth of what was predicted."""

            async def fetch(self, **_: object) -> GpuProfile:
                return GpuProfile(
                    gpu_model=MODEL, fp16=0.0, fp32=0.001, fp64=0.0, tensor=0.01,
                    sm_occupancy=0.02, dram_bandwidth=0.02, sm_utilization=0.05,
                )  # fmt: skip

        assert await c.duties.govern_round(Reader()) == ["default/opp"]  # type: ignore[arg-type]
        request = load_pause_request(c.annotations("default/opp")[ANN_PAUSE])
        assert request.reason == REASON_HARM and request.for_pods == ("default/big",)
        assert c.counted("paused", REASON_HARM) == 1.0
        # The model predicts no harm, but the pause holds while the pod it harmed is there.
        assert await c.duties.resume_round() == []
        c.delete("default/big")
        assert await c.duties.resume_round() == ["default/opp"]

    asyncio.run(scenario())


def test_paused_pods_are_counted_as_pausing_until_the_node_agent_reports_the_freeze() -> None:
    async def scenario() -> None:
        c = Cluster(
            placed("a", 20, SMALL), placed("gemm", 60, GEMM, tier=TIER_OPPORTUNISTIC, threads=60)
        )

        def states() -> dict[str, float]:
            text = generate_latest(c.metrics.registry).decode()
            return {
                s.labels["state"]: s.value
                for f in text_string_to_metric_families(text)
                for s in f.samples
                if s.name == "gpushare_opportunistic_pods"
            }

        assert states() == {"running": 1.0}
        await c.schedule(pending("big", 60, BIG))
        assert states() == {"pausing": 1.0}
        pod = c.store.pods["default/gemm"]
        request = load_pause_request(pod["metadata"]["annotations"][ANN_PAUSE])
        frozen = PauseState(since=request.since, request_since=request.since)
        pod["metadata"]["annotations"][ANN_PAUSED] = frozen.dump()
        c.view.upsert_pod(pod)
        assert states() == {"paused": 1.0}

    asyncio.run(scenario())


def test_an_unreadable_pause_request_counts_as_paused_and_the_leader_clears_it() -> None:
    """Only the controller writes gpushare.io/pause; a value it cannot read never fails the
    watch: the pod counts as paused (the node agent may have frozen it) until the next
    resumption round finds room and removes the request."""

    async def scenario() -> None:
        gemm = placed("gemm", 60, GEMM, tier=TIER_OPPORTUNISTIC, threads=60)
        gemm["metadata"]["annotations"][ANN_PAUSE] = "{not json"
        c = Cluster(placed("a", 20, SMALL), gemm)
        c.delete("default/a")  # beside it the GEMM stays paused (share_floor)
        facts = c.view.pod("default/gemm")
        assert facts is not None and facts.pause is not None and facts.pause.reason == ""
        assert c.tenant("default/gemm").paused
        assert await c.duties.resume_round() == ["default/gemm"]
        assert ANN_PAUSE not in c.annotations("default/gemm")

    asyncio.run(scenario())


def test_promotion_leaves_a_pod_refused_earlier_the_room_it_waits_for() -> None:
    """Opting in never jumps the queue: a guaranteed pod the filter found no room for, created
    before the opportunistic pod was placed, gets the room its neighbour leaves; the
    opportunistic pod is promoted only once that pod no longer needs it."""

    async def scenario() -> None:
        c = Cluster(
            placed("a", 60, SMALL), placed("o", 60, SMALL, tier=TIER_OPPORTUNISTIC, threads=100)
        )
        waiting = pending("g", 50, SMALL)
        assert c.refuse(waiting) == []
        c.delete("default/a")
        # 100% free now: without the waiting pod, the opportunistic one would take 60 of it.
        assert await c.duties.promote_round() == []
        assert c.tenant("default/o").opportunistic
        assert await c.schedule(waiting) == ""
        assert c.tenant("default/g").percent == 50
        assert await c.duties.promote_round() == []  # 50 free, it asks for 60
        c.delete("default/g")
        assert await c.duties.promote_round() == ["default/o"]
        assert [e[0] for e in c.store.events if e[1] == "Promoted"] == ["default/o"]

    asyncio.run(scenario())


def test_a_pod_created_after_the_opportunistic_one_was_placed_does_not_hold_it_back() -> None:
    async def scenario() -> None:
        c = Cluster(
            placed("a", 60, SMALL), placed("o", 60, SMALL, tier=TIER_OPPORTUNISTIC, threads=100)
        )
        later = pending("g", 50, SMALL)
        assert c.refuse(later) == []
        later["metadata"]["creationTimestamp"] = "2026-01-01T12:01:00Z"
        c.view.upsert_pod(later)
        c.delete("default/a")
        assert await c.duties.promote_round() == ["default/o"]

    asyncio.run(scenario())


def test_a_new_leader_knows_a_waiting_pod_from_its_own_first_refusal() -> None:
    """The waiting pods live in the leader that serves the extender (docs/packing.md, "The
    sharing contract"): a successor that never refused the pod promotes as before; once its
    own filter refuses it, the room is left to it."""

    async def scenario(refused_here: bool) -> list[str]:
        c = Cluster(
            placed("a", 60, SMALL), placed("o", 60, SMALL, tier=TIER_OPPORTUNISTIC, threads=100)
        )
        waiting = pending("g", 50, SMALL)
        waiting["metadata"]["creationTimestamp"] = "2026-01-01T11:59:00Z"
        if refused_here:
            assert c.refuse(waiting) == []
        else:  # refused by the leader before this one
            c.store.add(waiting)
            c.view.upsert_pod(waiting)
        c.delete("default/a")
        return await c.duties.promote_round()

    assert asyncio.run(scenario(refused_here=False)) == ["default/o"]
    assert asyncio.run(scenario(refused_here=True)) == []
