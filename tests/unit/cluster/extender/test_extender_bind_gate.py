"""The bind gate waits only behind pods the node agent could mistake for the one being bound
(same request size, still waiting for their Allocate), and says how long it waited."""

import asyncio
from datetime import UTC, datetime

from gpushare.api.names import STATE_ALLOCATED, STATE_ASSUMED
from gpushare.api.placement import Placement
from gpushare.cluster.extender.args import BindingArgs, parse_extender_args
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.state.view import ClusterView
from tests.fixtures.builders import GIB, PodStore, gpu, node_json, pod_json

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def waiting_on_a(state: str) -> dict[str, object]:
    """Pod w30 (30 %) bound to node a; with ``assumed`` its Allocate is still to come."""
    return pod_json(
        "w30", fraction="0.3", node="a", placement=Placement(("A0",), 30, 8 * GIB, NOW, state)
    )


def test_a_bind_waits_for_a_same_size_pod_allocate_and_not_for_another_size() -> None:
    view = ClusterView(clock=lambda: NOW)
    view.replace_nodes([node_json("a", [gpu("A0"), gpu("A1", index=1)])])
    view.replace_pods([waiting_on_a(STATE_ASSUMED)])
    store = PodStore()
    ext = Extender(view=view, writer=store, gate_seconds=5.0)
    stages: list[tuple[str, str, float]] = []

    async def scenario() -> tuple[str, str]:
        async def bind(name: str, fraction: str) -> str:
            pod = store.add(pod_json(name, fraction=fraction, scheduled=True))
            view.upsert_pod(pod)
            ext.filter(parse_extender_args({"Pod": pod, "NodeNames": ["a"]}))  # the scheduler's
            ext.bind_stage_observer = lambda stage, s: stages.append((name, stage, s))
            meta = pod["metadata"]
            args = BindingArgs(meta["name"], meta["namespace"], meta["uid"], "a")
            return (await ext.bind(args))["Error"]

        # Another size binds at once; the same size waits until w30 got its Allocate.
        assert await asyncio.wait_for(bind("x40", "0.4"), timeout=1.0) == ""
        same = asyncio.create_task(bind("y30", "0.3"))
        await asyncio.sleep(0.3)
        assert not same.done()
        view.upsert_pod(waiting_on_a(STATE_ALLOCATED))
        return await asyncio.wait_for(same, timeout=1.0), store.pods["default/y30"]["spec"].get(
            "nodeName", ""
        )

    error, node = asyncio.run(scenario())
    assert (error, node) == ("", "a")
    gate = {name: s for name, stage, s in stages if stage == "gate"}
    assert gate["x40"] < 0.1
    # The gate's clock starts when the bind task first runs, a little after the 0.3 s sleep
    # began (a few ms on a loaded machine): it waited for the Allocate, not a set time.
    assert 0.25 <= gate["y30"] < 1.5
    assert {stage for _, stage, _ in stages} == {"gate", "write"}


def test_a_bind_is_refused_when_no_pod_on_the_node_gets_its_allocate() -> None:
    """The node agent is down: w30 never gets its Allocate. Binding y30 anyway would have the
    kubelet refuse it ("no healthy devices") and the pod end Failed; the bind is refused with
    the reason, so the scheduler retries it once the agent is back."""
    view = ClusterView(clock=lambda: NOW)
    view.replace_nodes([node_json("a", [gpu("A0"), gpu("A1", index=1)])])
    view.replace_pods([waiting_on_a(STATE_ASSUMED)])
    store = PodStore()
    ext = Extender(view=view, writer=store, gate_seconds=0.3)
    pod = store.add(pod_json("y30", fraction="0.3", scheduled=True))
    view.upsert_pod(pod)
    ext.filter(parse_extender_args({"Pod": pod, "NodeNames": ["a"]}))
    meta = pod["metadata"]
    args = BindingArgs(meta["name"], meta["namespace"], meta["uid"], "a")
    error = asyncio.run(ext.bind(args))["Error"]
    assert "none got it" in error and "node agent" in error
    assert not store.pods["default/y30"]["spec"].get("nodeName")
    # Once the agent answers again, the same bind goes through.
    view.upsert_pod(waiting_on_a(STATE_ALLOCATED))
    assert asyncio.run(ext.bind(args))["Error"] == ""
    assert store.pods["default/y30"]["spec"]["nodeName"] == "a"
