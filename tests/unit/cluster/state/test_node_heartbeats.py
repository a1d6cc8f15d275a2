"""A kubelet's heartbeat (new condition times, a new resourceVersion) changes nothing the view
reads of a node, so the view takes it in without re-reading the node (at 5,000 nodes these
events were 4 % of the controller's samples, docs/scale.md); any change it reads still lands."""

import copy
from typing import Any

import pytest

from gpushare.api.names import ANN_AGENT_READY
from gpushare.cluster.state import view_node_events
from gpushare.cluster.state.view import ClusterView
from tests.fixtures.builders import GIB, gpu, node_json


def kubelet_node(cpu: str = "96", heartbeat: str = "2026-01-01T12:00:00Z") -> dict[str, Any]:
    node = node_json("n1", [gpu("GPU-1"), gpu("GPU-2", index=1)])
    node["metadata"]["resourceVersion"] = heartbeat
    node["metadata"]["annotations"][ANN_AGENT_READY] = "true"
    node["status"] = {
        "allocatable": {"cpu": cpu, "memory": "384Gi", "gpushare.io/gpu-percent": "200"},
        "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
        "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": heartbeat}],
    }
    return node


def a_view() -> ClusterView:
    view = ClusterView()
    view.replace_nodes([kubelet_node()])
    view.replace_pods([])
    return view


def test_a_heartbeat_is_not_read_again_moves_no_version_and_tells_no_listener(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    view = a_view()
    told: list[tuple[str, str]] = []
    view.listeners.append(lambda kind, key: told.append((kind, key)))
    version, seq = view.node_version("n1"), view.change_seq
    parsed: list[str] = []
    parse = view_node_events.parse_inventory
    monkeypatch.setattr(
        view_node_events,
        "parse_inventory",
        lambda name, ann: parsed.append(name) or parse(name, ann),
    )
    view.upsert_node(kubelet_node(heartbeat="2026-01-01T12:00:40Z"))
    assert (parsed, view.node_version("n1"), view.change_seq, told) == ([], version, seq, [])
    assert view.host_free("n1") == (96_000, 384 * GIB)
    view.upsert_node(kubelet_node(cpu="95", heartbeat="2026-01-01T12:01:20Z"))
    assert parsed == ["n1"]


def test_what_the_view_reads_still_lands_after_heartbeats() -> None:
    view = a_view()
    view.upsert_node(kubelet_node(heartbeat="2026-01-01T12:00:40Z"))
    view.upsert_node(kubelet_node(cpu="64", heartbeat="2026-01-01T12:01:20Z"))
    assert view.host_free("n1") == (64_000, 384 * GIB)
    not_ready = kubelet_node(cpu="64", heartbeat="2026-01-01T12:02:00Z")
    not_ready["metadata"]["annotations"][ANN_AGENT_READY] = "false"
    view.upsert_node(not_ready)
    assert view.node("n1") is None and "not ready" in (view.node_problem("n1") or "")
    view.upsert_node(kubelet_node(cpu="64", heartbeat="2026-01-01T12:02:40Z"))
    node = view.node("n1")
    assert node is not None and [g.uuid for g in node.gpus] == ["GPU-1", "GPU-2"]


def test_a_node_deleted_and_sent_again_unchanged_comes_back() -> None:
    view = a_view()
    same = kubelet_node()
    view.delete_node("n1")
    assert view.node("n1") is None
    view.upsert_node(copy.deepcopy(same))
    assert view.node("n1") is not None and view.host_free("n1") == (96_000, 384 * GIB)
