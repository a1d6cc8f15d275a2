"""When the pause loop runs and which pods it may touch (gpushare.node.pausing.loop): a watch
event wakes it only for a change it acts on (not for its own gpushare.io/paused record), and in
DRA mode a pod is gpushare's when it holds a claim the agent prepared."""

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpushare.api.names import ANN_PAUSE, ANN_PAUSED
from gpushare.api.pod import pod_info
from gpushare.node.pausing.loop import pause_loop


@dataclass(frozen=True)
class Settings:
    cgroup_root: Path
    pause_resync_s: float = 3600.0


@dataclass(frozen=True)
class Claim:
    pod: str


class Driver:
    def __init__(self, *pods: str) -> None:
        self.claims = {f"c{i}": Claim(p) for i, p in enumerate(pods)}

    def prepared(self) -> Mapping[str, Claim]:
        return self.claims


def manifest(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"u-{name}",
                     "annotations": dict(annotations or {})},
        "status": {"phase": "Running"},
    }  # fmt: skip


class Kube:
    """Lists the node's pods and streams the watch events the test feeds it."""

    def __init__(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        self.events = events
        self.lists = 0
        self.drained = threading.Event()

    def raw_node_pods(self) -> list[dict[str, Any]]:
        self.lists += 1
        return [manifest("a")]

    def watch_node_pods(self) -> Iterator[tuple[str, dict[str, Any]]]:
        yield from self.events
        self.drained.set()
        threading.Event().wait(3600)
        yield from ()

    def set_pod_annotation(self, **_: Any) -> None: ...

    def record_event(self, **_: Any) -> None: ...


def test_a_dra_pod_is_gpushares_when_it_holds_a_prepared_claim(tmp_path: Path) -> None:
    driver: list[Driver | None] = [Driver("ml/claimed")]
    loop = pause_loop(Kube([]), Settings(tmp_path), dra=lambda: driver[0])
    placed = loop.pauser.placed
    assert placed(pod_info(manifest("claimed")))
    assert not placed(pod_info(manifest("other")))
    driver[0] = None  # device-plugin mode: placement annotations only
    assert not placed(pod_info(manifest("claimed")))


def test_the_watch_wakes_the_loop_for_a_request_not_for_its_own_record(tmp_path: Path) -> None:
    pause = {ANN_PAUSE: '{"reason":"harm","message":"m","since":"t"}'}
    events = [
        ("ADDED", manifest("a")),
        ("MODIFIED", manifest("a", pause)),
        ("MODIFIED", manifest("a", {**pause, ANN_PAUSED: "{}"})),  # the agent's own write
    ]
    kube = Kube(events)
    loop = pause_loop(kube, Settings(tmp_path), dra=lambda: None)
    wakes: list[int] = []
    loop.wake = lambda: wakes.append(1)  # type: ignore[method-assign]
    stop = threading.Event()
    loop.start(stop)
    try:
        assert kube.drained.wait(5)
        deadline = time.monotonic() + 5
        while kube.lists < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
    assert len(wakes) == 2  # the pod seen, then its request; not the record
    assert kube.lists >= 1  # the first pass read the pods itself
