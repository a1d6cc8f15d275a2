"""The Grafana dashboards only reference series something in gpushare exports.

Catches a renamed metric or a typo in a panel before any Prometheus runs; the cluster test
(tests/cluster/test_monitoring_operator.py) then proves every panel's query returns data
through ServiceMonitors. The names come from the real collectors (node exporter, controller,
operator guard), never from a list kept here.
"""

import asyncio
import json
import re

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpushare.cluster.metrics import Metrics
from gpushare.cluster.operator.guard import LatencyGuard
from gpushare.cluster.operator.settings import OperatorConfig
from gpushare.cluster.state.view import ClusterView
from gpushare.node.exporter import HealthRecorder, MpsDaemonStatus, PodAllocation, build_exporter
from gpushare.node.gpu.backend import HealthEvent
from gpushare.node.gpu.simulated import SimulatedBackend
from tests import REPO
from tests.fixtures.builders import gpu, node_json, pod_json

DASHBOARDS = REPO / "helm" / "gpushare" / "dashboards"
_NAME = re.compile(r"\b(gpushare_[a-z0-9_]+)\b")
_DCGM = re.compile(r"\b(DCGM_FI_[A-Z0-9_]+)\b")


def panels(board: dict[str, object]) -> list[dict[str, object]]:
    return [p for p in board["panels"] if isinstance(p, dict) and p.get("type") != "row"]  # type: ignore[attr-defined]


def exporter_series_names() -> set[str]:
    """Every series name a node exporter serves when it has pods, MPS and an XID to report."""
    backend = SimulatedBackend("1xH100-80GB", node_name="n")
    uuid = backend.inventory()[0].uuid
    health = HealthRecorder()
    health.record(HealthEvent(uuid=uuid, healthy=True, reason="xid", xid=13))
    pod = PodAllocation("ns", "p", "uid", (uuid,), 0.5, 50, 2**30)
    exporter = build_exporter(
        backend=backend,
        node_name="n",
        placements=lambda: [pod],
        mps_status=lambda: {uuid: MpsDaemonStatus(up=True)},
        health=health,
    )
    exporter.sampler.sample_once()
    registry = CollectorRegistry()
    registry.register(exporter.collector)
    text = generate_latest(registry).decode()
    # Per-pod memory needs a real pod process; its name comes from the family list instead.
    names = {"gpushare_pod_gpu_memory_used_bytes"}
    for family in text_string_to_metric_families(text):
        names.update(s.name for s in family.samples)
    return names


def controller_series_names() -> set[str]:
    """Every series name the controller serves with a pending pod, a profiled GpuShare and
    the operator's latency guard registered (as gpushare-controller wires them)."""
    view = ClusterView()
    view.replace_nodes([node_json("n1", [gpu("G0")])])
    view.replace_pods([pod_json("waiting", fraction="0.25")])
    profile = {"gpuModel": "m", "fp32": 0.5, "sampledSeconds": 30, "time": "2026-01-01T00:00:00Z"}
    view.replace_shares(
        [{"metadata": {"namespace": "ns", "name": "s"}, "status": {"profile": profile}}]
    )
    metrics = Metrics(view)
    guard_view = ClusterView()
    guard_view.upsert_node(node_json("n1", [gpu("G0")]))
    guard = LatencyGuard(
        config=OperatorConfig(),
        kube=None,  # type: ignore[arg-type]
        view=guard_view,
        profiler=None,  # type: ignore[arg-type]
        registry=metrics.registry,
    )
    asyncio.run(guard.tick())
    text = generate_latest(metrics.registry).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.mark.parametrize("name", ["cluster", "node-gpu", "workload"])
def test_dashboard_queries_reference_only_exported_series(name: str) -> None:
    board = json.loads((DASHBOARDS / f"{name}.json").read_text())
    controller = controller_series_names()
    known = exporter_series_names() | controller
    unknown: dict[str, set[str]] = {}
    for panel in panels(board):
        exprs = [t["expr"] for t in panel["targets"]]  # type: ignore[attr-defined]
        assert exprs, f"panel {panel['title']!r} has no query"
        for expr in exprs:
            missing = set(_NAME.findall(expr)) - known
            if missing:
                unknown[str(panel["title"])] = missing
            if controller & set(_NAME.findall(expr)):
                assert "gpushare controller" in str(panel["description"]), panel["title"]
            if _DCGM.findall(expr):
                # DCGM's series exist only beside dcgm-exporter: the panel must say so, and
                # join on gpushare's GPUs so it never shows GPUs gpushare does not share.
                assert "dcgm-exporter" in str(panel["description"]), panel["title"]
                assert "on (gpu_uuid) gpushare_gpu_info" in expr, panel["title"]
    assert unknown == {}


@pytest.mark.parametrize("name", ["cluster", "node-gpu", "workload"])
def test_dashboard_is_importable_grafana_json(name: str) -> None:
    board = json.loads((DASHBOARDS / f"{name}.json").read_text())
    assert board["uid"] == f"gpushare-{name}"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in board["templating"]["list"]}
    for panel in panels(board):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for expr in (t["expr"] for t in panel["targets"]):  # type: ignore[attr-defined]
            # $1 is label_replace's capture reference, which Grafana leaves alone.
            for var in re.findall(r"\$([A-Za-z_]\w*)", expr):
                assert var.startswith("__") or var in variables, (panel["title"], var)
