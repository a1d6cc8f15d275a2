"""The node agent's drain for the GPU Operator's driver upgrades and MIG changes (issue #66):
gpushare's pods marked for eviction with an Event each, the MPS daemons stopped once none is
left, the drain marker the preStop hook waits for, and back to serving when the labels are;
unexpected label values and failing API calls never stop it."""

import logging
from pathlib import Path

import pytest

from gpushare.api.gpu_operator import MIG_CONFIG_STATE, UPGRADE_STATE
from gpushare.api.names import ANN_GPU_UUID
from gpushare.api.pod import PodInfo
from gpushare.node.core.health import DeviceHealth
from gpushare.node.gpu_operator import (
    DRAIN_MARKER,
    HEALTH_SOURCE,
    REASON_DRAINED,
    REASON_PAUSED,
    REASON_RESUMED,
    GpuOperatorDrain,
    gpu_pods,
)

GPU = "GPU-aaaaaaaa-1111-2222-3333-444444444444"


def pod(name: str, *, gpu: bool = True, phase: str = "Running") -> PodInfo:
    annotations = {ANN_GPU_UUID: GPU} if gpu else {}
    return PodInfo("team", name, f"uid-{name}", annotations, phase=phase)


class Node:
    """The node as the agent sees it: labels, pods, and what the agent did."""

    def __init__(self, tmp_path: Path) -> None:
        self.labels: dict[str, str] = {}
        self.pods = [pod("a"), pod("b"), pod("plain", gpu=False), pod("done", phase="Succeeded")]
        self.marked: list[tuple[str, str]] = []
        self.events: list[tuple[str | None, str, bool]] = []
        self.mps: list[str] = []
        self.changes = 0
        self.fail_labels = False
        self.health = DeviceHealth([GPU])
        self.drain = GpuOperatorDrain(
            node_labels=self.read_labels,
            gpu_pods=lambda: gpu_pods(self.pods),
            mark_for_eviction=lambda p, why: self.marked.append((p.key, why)),
            event=lambda p, reason, _m, warning: self.events.append(
                (p.key if p else None, reason, warning)
            ),
            stop_mps=lambda: self.mps.append("stop"),
            start_mps=lambda: self.mps.append("start"),
            changed=self.changed,
            marker_dir=tmp_path,
            health=self.health,
        )
        self.marker = tmp_path / DRAIN_MARKER

    def read_labels(self) -> dict[str, str]:
        if self.fail_labels:
            raise ConnectionError("API server unreachable")
        return dict(self.labels)

    def changed(self) -> None:
        self.changes += 1


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_a_driver_upgrade_evicts_gpushares_pods_then_stops_the_mps_daemons(node: Node) -> None:
    node.drain.step()
    assert node.drain.pause is None and node.drain.not_ready_reason() is None
    node.labels[UPGRADE_STATE] = "pod-deletion-required"
    node.drain.step()
    reason = node.drain.not_ready_reason()
    assert reason is not None and "driver upgrade" in reason and "draining" in reason
    assert [k for k, _ in node.marked] == ["team/a", "team/b"]  # not the plain or done pod
    assert "pod-deletion-required" in node.marked[0][1]
    # Its GPUs unhealthy meanwhile: the kubelet hands out none, the agent reads not ready.
    problem = node.health.problems(GPU)[HEALTH_SOURCE]
    assert "driver upgrade" in problem and node.health.snapshot()[1] == {GPU: False}
    assert (None, REASON_PAUSED, True) in node.events
    assert ("team/a", REASON_DRAINED, True) in node.events
    assert node.mps == [] and node.marker.read_text() == "draining\n"
    node.drain.step()  # still there: marked once only
    assert len(node.marked) == 2
    node.pods = [p for p in node.pods if p.name not in ("a", "b")]
    node.labels[UPGRADE_STATE] = "drain-required"
    node.drain.step()
    assert node.mps == ["stop"] and node.drain.drained
    assert node.marker.read_text() == "drained\n"
    node.drain.step()
    assert node.mps == ["stop"]
    # Back: the new driver validated.
    node.labels[UPGRADE_STATE] = "validation-required"
    node.drain.step()
    assert node.mps == ["stop", "start"] and node.drain.pause is None
    assert node.health.snapshot()[1] == {GPU: True}
    assert not node.marker.exists()
    assert (None, REASON_RESUMED, False) in node.events
    assert node.changes >= 3


def test_a_mig_change_drains_too_and_a_new_pod_during_it_is_marked(node: Node) -> None:
    node.labels[MIG_CONFIG_STATE] = "pending"
    node.drain.step()
    node.pods.append(pod("late"))
    node.drain.step()
    assert [k for k, _ in node.marked] == ["team/a", "team/b", "team/late"]


def test_unexpected_values_are_logged_once_and_ignored(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    node.labels[UPGRADE_STATE] = "banana"
    with caplog.at_level(logging.WARNING):
        node.drain.step()
        node.drain.step()
    told = [r for r in caplog.records if "banana" in r.getMessage()]
    assert len(told) == 1 and "ignored" in told[0].getMessage()
    assert node.drain.pause is None and node.marked == []


def test_failing_reads_and_writes_keep_the_state_and_retry(node: Node) -> None:
    node.labels[UPGRADE_STATE] = "pod-restart-required"
    node.drain.step()
    assert node.drain.pause is not None
    node.fail_labels = True
    node.drain.step()  # no labels read: still paused
    assert node.drain.pause is not None
    node.fail_labels = False
    calls: list[str] = []

    def flaky(p: PodInfo, why: str) -> None:
        calls.append(p.key)
        if len(calls) == 1:
            raise ConnectionError("refused")

    node.drain._mark = flaky
    node.drain._marked.clear()
    node.drain.step()
    node.drain.step()
    assert calls == ["team/a", "team/b", "team/a"]


def test_a_new_agent_starts_without_a_stale_marker(tmp_path: Path) -> None:
    (tmp_path / DRAIN_MARKER).write_text("drained\n")
    Node(tmp_path)
    assert not (tmp_path / DRAIN_MARKER).exists()
