"""The Grafana dashboards only reference series something in gpushare exports.

Catches a renamed metric or a typo in a panel before any Prometheus runs; the cluster test
(tests/cluster/test_exporter_prometheus.py) then proves every panel's query returns data.
"""

import json
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpushare.exporter import HealthRecorder, MpsDaemonStatus, PodAllocation, build_exporter
from gpushare.gpu.backend import HealthEvent
from gpushare.gpu.simulated import SimulatedBackend

DASHBOARDS = Path(__file__).resolve().parents[2] / "helm" / "gpushare" / "dashboards"
# Series the controller/operator export (see docs/observability.md).
CONTROLLER_METRICS = {
    "gpushare_pending_pods",
    "gpushare_protection_evictions_total",
    "gpushare_gpushare_profile_pipe_ratio",
}
_NAME = re.compile(r"\b(gpushare_[a-z0-9_]+)\b")


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


@pytest.mark.parametrize("name", ["cluster", "node-gpu", "workload"])
def test_dashboard_queries_reference_only_exported_series(name: str) -> None:
    board = json.loads((DASHBOARDS / f"{name}.json").read_text())
    known = exporter_series_names() | CONTROLLER_METRICS
    unknown: dict[str, set[str]] = {}
    for panel in panels(board):
        exprs = [t["expr"] for t in panel["targets"]]  # type: ignore[attr-defined]
        assert exprs, f"panel {panel['title']!r} has no query"
        for expr in exprs:
            missing = set(_NAME.findall(expr)) - known
            if missing:
                unknown[str(panel["title"])] = missing
            if CONTROLLER_METRICS & set(_NAME.findall(expr)):
                assert "gpushare controller" in str(panel["description"]), panel["title"]
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
            for var in re.findall(r"\$(\w+)", expr):
                assert var.startswith("__") or var in variables, (panel["title"], var)
