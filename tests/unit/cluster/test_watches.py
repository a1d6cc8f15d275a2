"""The controller's watches: readers besides the view, and the GpuShare watch handed to Kopf."""

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest

from gpushare.cluster import watches
from gpushare.cluster.state.view import ClusterView
from gpushare.kube.controller import Watched
from tests.fixtures.builders import pod_json

SHARE = {"metadata": {"name": "s", "namespace": "ml"}, "spec": {}, "status": {"phase": "Packed"}}


class Informers:
    """Stands in for the API server's list and watch: delivers ``listing`` per kind, then
    blocks like an open watch (or raises ``error``)."""

    def __init__(
        self, listing: Mapping[Watched, list[dict[str, Any]]], error: Exception | None = None
    ):
        self.listing = listing
        self.error = error
        self.open: set[Watched] = set()

    async def inform(
        self,
        kind: Watched,
        *,
        replace: Callable[[Iterable[Mapping[str, Any]]], None],
        upsert: Callable[[Mapping[str, Any]], object],
        delete: Callable[[Mapping[str, Any]], None],
        resync_seconds: float,
    ) -> None:
        replace(self.listing.get(kind, []))
        if self.error is not None:
            raise self.error
        self.open.add(kind)
        try:
            await asyncio.Event().wait()
        finally:
            self.open.discard(kind)


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.listed: list[list[Mapping[str, Any]]] = []

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> None:
        if self.fail:
            raise RuntimeError("reader broke")
        self.listed.append(list(objects))

    def upsert(self, obj: Mapping[str, Any]) -> None: ...

    def delete(self, obj: Mapping[str, Any]) -> None: ...


async def test_pods_reach_the_view_and_every_reader_even_when_one_reader_fails() -> None:
    view = ClusterView()
    pods = [pod_json("a", fraction="0.5", scheduled=True)]
    kube = Informers({Watched.PODS: pods})
    broken, reader = Recorder(fail=True), Recorder()
    task = asyncio.create_task(
        watches.feed_pods(kube, view, resync_seconds=60, also=(broken, reader))  # type: ignore[arg-type]
    )
    await asyncio.sleep(0.01)
    assert Watched.PODS in kube.open  # the watch goes on
    assert view.pods_synced
    assert reader.listed == [pods]
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
