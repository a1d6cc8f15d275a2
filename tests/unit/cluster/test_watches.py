"""The controller's watches: the view's listeners (the operator), and the GpuShare watch handed
to Kopf."""

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest

from gpushare.cluster import watches
from gpushare.cluster.state.view import ClusterView
from gpushare.kube.watching import Watched
from tests.fixtures.builders import pod_json

SHARE = {"metadata": {"name": "s", "namespace": "ml"}, "spec": {}, "status": {"phase": "Packed"}}


class Informers:
    """Stands in for the API server's list and watch: delivers ``listing`` per kind, then its
    ``changes`` (upserted objects), then blocks like an open watch (or raises ``error``)."""

    def __init__(
        self,
        listing: Mapping[Watched, list[dict[str, Any]]],
        error: Exception | None = None,
        changes: Mapping[Watched, list[dict[str, Any]]] | None = None,
    ):
        self.listing = listing
        self.error = error
        self.changes = changes or {}
        self.open: set[Watched] = set()

    async def inform(
        self,
        kind: Watched,
        *,
        replace: Callable[[Iterable[Mapping[str, Any]]], None],
        upsert: Callable[[Mapping[str, Any]], object],
        delete: Callable[[Mapping[str, Any]], None],
        resync_seconds: float,
        namespace: str | None = None,
    ) -> None:
        replace(self.listing.get(kind, []))
        for obj in self.changes.get(kind, []):
            upsert(obj)
        if self.error is not None:
            raise self.error
        self.open.add(kind)
        try:
            await asyncio.Event().wait()
        finally:
            self.open.discard(kind)


async def test_pods_reach_the_view_and_every_listener_even_when_one_listener_fails() -> None:
    view = ClusterView()
    pods = [pod_json("a", fraction="0.5", scheduled=True)]
    changed = pod_json("b", fraction="0.5", scheduled=True)
    kube = Informers({Watched.PODS: pods}, changes={Watched.PODS: [changed]})
    heard: list[str] = []

    def broken(_pod: object) -> None:
        raise RuntimeError("listener broke")

    view.pod_listeners += [broken, lambda pod: heard.append(pod.key)]
    task = asyncio.create_task(
        watches.feed_pods(kube, view, resync_seconds=60)  # type: ignore[arg-type]
    )
    await asyncio.sleep(0.01)
    assert Watched.PODS in kube.open  # the watch goes on
    assert view.pods_synced
    assert sorted(view.pods()) == ["default/a", "default/b"]
    assert heard == ["default/b"]  # a change, not the pods of a full list
    task.cancel()


def test_handoff_waits_for_kopfs_list_while_the_view_holds_shares() -> None:
    view = ClusterView()
    view.upsert_share(SHARE)
    handoff = watches.ShareHandoff(view)
    handoff.operator_ready()
    assert not handoff.done.is_set()  # Kopf may not have listed: a deletion could go unseen
    handoff.kopf_event()
    assert handoff.done.is_set()


def test_handoff_at_operator_ready_when_there_is_no_share_to_lose() -> None:
    handoff = watches.ShareHandoff(ClusterView())
    assert not handoff.done.is_set()
    handoff.operator_ready()
    assert handoff.done.is_set()


async def test_share_informer_stops_at_the_handoff_and_keeps_what_it_listed() -> None:
    view = ClusterView()
    kube = Informers({Watched.SHARES: [SHARE]})
    handoff = watches.ShareHandoff(view)
    task = asyncio.create_task(
        watches.feed_shares(kube, view, resync_seconds=60, handoff=handoff)  # type: ignore[arg-type]
    )
    await asyncio.sleep(0.01)
    assert Watched.SHARES in kube.open
    handoff.kopf_event()
    await asyncio.wait_for(task, timeout=1)
    assert Watched.SHARES not in kube.open  # one GpuShare watch left: Kopf's
    assert view.share_status("ml", "s") == {"phase": "Packed"}


async def test_a_failing_share_informer_is_not_mistaken_for_a_handoff() -> None:
    kube = Informers({}, error=RuntimeError("API server gone"))
    handoff = watches.ShareHandoff(ClusterView())
    with pytest.raises(RuntimeError, match="API server gone"):
        await watches.feed_shares(kube, ClusterView(), resync_seconds=60, handoff=handoff)  # type: ignore[arg-type]
