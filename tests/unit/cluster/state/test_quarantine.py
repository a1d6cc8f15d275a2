"""One bad object never fails a list or a watch (issue #45): the view holds it out, keeps what
it knew of it, reports it with an Event and a metric, and takes the rest of the cluster in."""

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from gpushare.api.placement import Placement
from gpushare.cluster import quarantine_reports, watches
from gpushare.cluster.metrics import Metrics
from gpushare.cluster.state import view_pod_events
from gpushare.cluster.state.view import ClusterView
from gpushare.kube.events import ObjectRef
from gpushare.kube.watching import Watched
from tests.fixtures.builders import GIB, gpu, node_json, pod_json
from tests.unit.cluster.test_watches import Informers

UUID = "GPU-q-0"


def placed(name: str, percent: int, *, namespace: str = "ml") -> dict[str, Any]:
    placement = Placement(
        gpu_uuids=(UUID,),
        thread_percent=100,
        memory_limit_bytes=GIB,
        bind_time=datetime(2026, 1, 1, tzinfo=UTC),
        state="allocated",
        request_percent=percent,
    )
    return pod_json(
        name,
        namespace=namespace,
        fraction=f"{percent / 100:.2f}",
        node="n1",
        placement=placement,
        phase="Running",
        scheduled=True,
    )


@pytest.fixture
def poison(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Names of pods the view's reading raises on (a bug in parsing, which is total)."""
    names: set[str] = set()
    real = view_pod_events.facts

    def facts(pod: Mapping[str, Any]) -> Any:
        if pod.get("metadata", {}).get("name") in names:
            raise ArithmeticError("a bug the fuzz has not found yet")
        return real(pod)

    monkeypatch.setattr(view_pod_events, "facts", facts)
    return names


def test_a_pod_in_any_namespace_with_an_exponent_near_a_million_is_simply_counted() -> None:
    view = ClusterView()
    view.replace_nodes([node_json("n1", [gpu(UUID)])])
    huge = pod_json(
        "huge",
        namespace="anyone",
        node="n1",
        containers=[{"name": "c", "resources": {"requests": {"cpu": "1e999999"}}}],
    )
    view.replace_pods([huge, placed("train", 30)])
    assert view.synced and not view.quarantine.held()
    assert view.gpu(UUID) is not None and view.gpu(UUID).used_percent == 30  # type: ignore[union-attr]


def test_a_pod_the_view_cannot_read_is_held_out_and_the_list_goes_on(poison: set[str]) -> None:
    view = ClusterView()
    view.replace_nodes([node_json("n1", [gpu(UUID)])])
    poison.add("bad")
    view.replace_pods([placed("a", 20), placed("bad", 30), placed("b", 10)])
    assert view.synced
    assert sorted(view.pods()) == ["ml/a", "ml/b"]
    [held] = view.quarantine.held()
    assert (held.kind, held.key) == ("Pod", "ml/bad") and "ArithmeticError" in held.error
    assert view.quarantine.counts() == {"Pod": 1}


def test_a_held_pod_keeps_its_share_and_is_let_go_once_readable(poison: set[str]) -> None:
    view = ClusterView()
    view.replace_nodes([node_json("n1", [gpu(UUID)])])
    view.replace_pods([placed("a", 20), placed("bad", 30)])
    assert view.gpu(UUID).used_percent == 50  # type: ignore[union-attr]
    poison.add("bad")
    view.replace_pods([placed("a", 20), placed("bad", 30)])  # a resync meets the bug
    assert view.gpu(UUID).used_percent == 50  # type: ignore[union-attr]  # nothing placed is lost
    assert [h.key for h in view.quarantine.held()] == ["ml/bad"]
    poison.clear()
    view.quarantine.take("Pod", placed("bad", 30), view.upsert_pod)
    assert not view.quarantine.held()


async def test_a_watch_event_the_view_cannot_read_is_held_and_the_watch_stays_open(
    poison: set[str],
) -> None:
    view = ClusterView()
    view.replace_nodes([node_json("n1", [gpu(UUID)])])
    poison.add("bad")
    kube = Informers(
        {Watched.PODS: [placed("bad", 30)]}, changes={Watched.PODS: [placed("bad", 40)]}
    )
    task = asyncio.create_task(watches.feed_pods(kube, view, resync_seconds=60))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    assert Watched.PODS in kube.open and view.synced
    assert [h.key for h in view.quarantine.held()] == ["ml/bad"]
    assert view.quarantine.total == {"Pod": 2}
    task.cancel()


def test_a_flood_of_bad_objects_is_counted_not_kept(poison: set[str]) -> None:
    view = ClusterView()
    names = [f"p{i}" for i in range(1200)]
    poison.update(names)
    view.replace_pods([placed(n, 1) for n in names])
    assert len(view.quarantine.held()) == 1000
    assert view.quarantine.overflow == 200 and view.quarantine.total == {"Pod": 1200}


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.events: list[tuple[ObjectRef, str, str]] = []
        self.fail = fail

    async def record_event(
        self, *, about: ObjectRef, reason: str, message: str, warning: bool
    ) -> None:
        if self.fail:
            raise RuntimeError("API server away")
        assert warning
        self.events.append((about, reason, message))


async def test_each_held_object_gets_one_event_naming_it_and_the_fix(poison: set[str]) -> None:
    view = ClusterView()
    poison.add("bad")
    view.replace_pods([placed("bad", 30)])
    away = Recorder(fail=True)
    assert await quarantine_reports.report_round(away, [view.quarantine]) == 0  # type: ignore[arg-type]
    kube = Recorder()
    assert await quarantine_reports.report_round(kube, [view.quarantine]) == 1  # type: ignore[arg-type]
    [(about, reason, message)] = kube.events
    assert (about.kind, about.namespace, about.name) == ("Pod", "ml", "bad")
    assert reason == "GpushareUnreadable" and "Fix:" in message and "ArithmeticError" in message
    view.replace_pods([placed("bad", 30)])  # held again the same way: no second Event
    assert await quarantine_reports.report_round(kube, [view.quarantine]) == 0  # type: ignore[arg-type]


def test_held_objects_are_in_the_controller_metrics(poison: set[str]) -> None:
    view = ClusterView()
    poison.add("bad")
    view.replace_pods([placed("bad", 30)])
    metrics = Metrics(view)
    assert (
        metrics.registry.get_sample_value(
            "gpushare_controller_quarantined_objects", {"kind": "Pod"}
        )
        == 1
    )
    assert (
        metrics.registry.get_sample_value("gpushare_controller_quarantined_total", {"kind": "Pod"})
        == 1
    )
