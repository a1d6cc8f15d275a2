"""The node's one restart loop (gpushare.node.core.serving.RestartLoop): the mode's kubelet
plugins are served again together when one of them changed, on request, and after a failed
start; they are stopped when the agent stops."""

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from gpushare.node.core.serving import RestartLoop


class FakePlugin:
    def __init__(self, name: str, *, fail_starts: int = 0) -> None:
        self.name = name
        self.starts = 0
        self.stops = 0
        self.serving = False
        self.gone: str | None = None
        self.fail_starts = fail_starts

    def start(self) -> None:
        if self.fail_starts:
            self.fail_starts -= 1
            raise OSError("kubelet.sock does not exist")
        self.starts += 1
        self.gone = None
        self.serving = True

    def changed(self) -> str | None:
        return self.gone

    def stop(self) -> None:
        self.stops += 1
        self.serving = False


def eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


@pytest.fixture
def running() -> Iterator[tuple[RestartLoop, FakePlugin, FakePlugin, threading.Event]]:
    guaranteed, opportunistic = FakePlugin("guaranteed"), FakePlugin("opportunistic")
    loop = RestartLoop([guaranteed, opportunistic], poll_s=0.01, retry_s=0.01)
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    thread.start()
    eventually(lambda: guaranteed.serving and opportunistic.serving)
    yield loop, guaranteed, opportunistic, stop
    stop.set()
    thread.join(5)
    assert not thread.is_alive()


def test_one_plugins_socket_gone_serves_every_plugin_again(
    running: tuple[RestartLoop, FakePlugin, FakePlugin, threading.Event],
) -> None:
    _, guaranteed, opportunistic, _ = running
    opportunistic.gone = "gpushare-opportunistic.sock was removed"
    eventually(lambda: guaranteed.starts == 2 and opportunistic.starts == 2)
    assert guaranteed.serving and opportunistic.serving


def test_sighup_serves_every_plugin_again(
    running: tuple[RestartLoop, FakePlugin, FakePlugin, threading.Event],
) -> None:
    loop, guaranteed, opportunistic, _ = running
    loop.request_restart()
    eventually(lambda: guaranteed.starts == 2 and opportunistic.starts == 2)


def test_stopping_the_agent_stops_every_plugin(
    running: tuple[RestartLoop, FakePlugin, FakePlugin, threading.Event],
) -> None:
    _, guaranteed, opportunistic, stop = running
    stop.set()
    eventually(lambda: not guaranteed.serving and not opportunistic.serving)


def test_a_failed_start_is_retried_until_the_kubelet_is_there() -> None:
    plugin = FakePlugin("dra", fail_starts=3)
    loop = RestartLoop([plugin], poll_s=0.01, retry_s=0.01)
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    thread.start()
    try:
        eventually(lambda: plugin.serving)
        assert plugin.fail_starts == 0 and plugin.starts == 1
        # Every failed try left nothing half-served behind.
        assert plugin.stops >= 3
    finally:
        stop.set()
        thread.join(5)
