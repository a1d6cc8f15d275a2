"""The informer lists once, then keeps watching: a watch the API server ends is opened again
from the last version it delivered (no relist, which costs a busy controller about a second of CPU
at 10,000 pods); a 410 Gone and the resync period list again."""

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from gpushare.kube import informer
from gpushare.kube.errors import GoneError


def pod(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": version}}


class Server:
    """Lists and watches as the API server answers them: each watch call takes the next
    script entry, a list of events then how the stream ends (None: the server closes it,
    an exception: an error, "hang": it stays open)."""

    def __init__(self, script: list[tuple[list[tuple[str, dict[str, Any]]], object]]) -> None:
        self.script = script
        self.lists = 0
        self.watched_from: list[str] = []
        self.done = asyncio.Event()

    async def list_all(self) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        return [pod("a", "10")], "10"

    async def watch(self, version: str, _timeout: int) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.watched_from.append(version)
        if not self.script:
            self.done.set()
            await asyncio.Event().wait()
        events, end = self.script.pop(0)
        for event in events:
            yield event
        if isinstance(end, BaseException):
            raise end
        if end == "hang":
            await asyncio.Event().wait()


async def run(server: Server, *, resync_seconds: float = 60.0) -> dict[str, Mapping[str, Any]]:
    seen: dict[str, Mapping[str, Any]] = {}

    def replace(objs: Any) -> None:
        seen.clear()
        seen.update({o["metadata"]["name"]: o for o in objs})

    task = asyncio.create_task(
        informer.inform(
            "Pod",
            list_all=server.list_all,
            watch=server.watch,
            replace=replace,
            upsert=lambda o: seen.__setitem__(o["metadata"]["name"], o),
            delete=lambda o: seen.pop(o["metadata"]["name"], None),
            resync_seconds=resync_seconds,
        )
    )
    await asyncio.wait_for(server.done.wait(), timeout=5)
    task.cancel()
    return seen


async def test_a_watch_the_server_ends_is_opened_again_from_the_last_version_seen() -> None:
    server = Server(
        [
            ([("ADDED", pod("b", "11")), ("MODIFIED", pod("a", "12"))], None),
            ([("DELETED", pod("b", "13"))], None),
        ]
    )
    seen = await run(server)
    assert server.lists == 1  # listed once: no relist when the server ended the watch
    assert server.watched_from == ["10", "12", "13"]
    assert sorted(seen) == ["a"] and seen["a"]["metadata"]["resourceVersion"] == "12"


async def test_too_old_a_version_lists_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(informer, "REWATCH_PAUSE_S", 0.0)
    gone = GoneError("watch Pod: too old resource version", status=410)
    server = Server([([("ADDED", pod("b", "11"))], None), ([], gone)])
    await run(server)
    assert server.lists == 2
    assert server.watched_from == ["10", "11", "10"]  # the second list's version


async def test_the_resync_period_lists_again_while_the_watch_is_open() -> None:
    server = Server([([], "hang")])
    await run(server, resync_seconds=0.05)
    assert server.lists == 2
    assert server.watched_from == ["10", "10"]


async def test_a_burst_of_events_lets_other_work_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst the stream delivers at once is not applied in one go: work that became ready
    meanwhile (an extender call) runs within a slice, not after the whole burst."""
    monkeypatch.setattr(informer, "WATCH_SLICE_S", 0.002)
    applied: list[str] = []
    seen_by_other: list[int] = []

    def slow_upsert(o: Mapping[str, Any]) -> None:
        applied.append(o["metadata"]["name"])
        time.sleep(0.001)  # a pod event taking 1 ms of the loop

    async def other() -> None:
        await asyncio.sleep(0)
        seen_by_other.append(len(applied))

    server = Server([([("ADDED", pod(f"p{i}", str(11 + i))) for i in range(50)], None)])
    task = asyncio.create_task(
        informer.inform(
            "Pod",
            list_all=server.list_all,
            watch=server.watch,
            replace=lambda objs: None,
            upsert=slow_upsert,
            delete=lambda o: None,
            resync_seconds=60.0,
        )
    )
    waiting = asyncio.create_task(other())
    await asyncio.wait_for(server.done.wait(), timeout=5)
    task.cancel()
    await waiting
    assert len(applied) == 50
    assert seen_by_other and seen_by_other[0] < 10  # in after a slice, not after all 50
