"""Every metric family gpushare exports is on a dashboard, or the reason it is not is written
here; and the control-plane dashboard names only exported series (#46: 32 families appeared on
no dashboard). The families come from the real collectors, fed so that each family has a
sample: the node exporter and the controller as tests/unit/node/exporter/test_exporter_dashboards.py
builds them, plus the node agent's own collector, fault handling's and the DRA totals.
"""

import json
import re
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpushare.cluster.event_loop import TurnStats
from gpushare.cluster.metrics import Metrics
from gpushare.cluster.state.view import ClusterView
from gpushare.node.faults.metrics import FaultCollector, FaultStats
from gpushare.node.metrics import AgentCollector
from tests import REPO
from tests.fixtures.builders import gpu, node_json
from tests.unit.node.exporter.test_exporter_dashboards import (
    controller_series_names,
    exporter_series_names,
    panels,
)

DASHBOARDS = REPO / "helm" / "gpushare" / "dashboards"
_NAME = re.compile(r"\b(gpushare_[a-z0-9_]+)\b")
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")

NOT_ON_A_DASHBOARD = {
    "gpushare_gpu_limit_compute_ratio": "the sum of a GPU's thread caps: the caps themselves "
    "(gpushare_pod_gpu_active_thread_ratio) are on the Node and GPU and Workloads dashboards, "
    "and their sum is above 1 by design (a cap is a limit, not a reservation)",
}
"""Families left off every dashboard, each with the reason."""


def family(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _names(registry: CollectorRegistry) -> set[str]:
    """Sample names, and the names of families exported without a sample yet (a gauge per
    namespace before any pod, a counter per kind before any event)."""
    text = generate_latest(registry).decode()
    families = list(text_string_to_metric_families(text))
    return {s.name for f in families for s in f.samples} | {
        f.name + ("_total" if f.type == "counter" else "") for f in families
    }


def node_agent_series_names() -> set[str]:
    registry = CollectorRegistry()
    registry.register(
        AgentCollector(node_name="n", backend_name="simulated", stats=lambda: {"allocations": 1})
    )
    stats = FaultStats()
    stats.incidents[("G0", "yes")] += 1
    stats.clients[("G0", "victim")] += 1
    stats.detection_s["G0"] = 0.5
    stats.recovery_s["G0"] = 1.0
    registry.register(FaultCollector(node_name="n", stats=stats, exclusive={}))
    return _names(registry)


def controller_view() -> ClusterView:
    view = ClusterView()
    view.replace_nodes([node_json("n1", [gpu("G0")])])
    return view


def request_series_names() -> set[str]:
    """What a replica counts of its own requests, once it answered some."""
    metrics = Metrics()
    metrics.extender_seconds.labels("filter").observe(0.01)
    metrics.extender_requests.labels("filter", "ok").inc()
    metrics.bind_stage_seconds.labels("gate").observe(0.01)
    metrics.binds.labels("bound").inc()
    metrics.webhook_seconds.labels("mutate").observe(0.01)
    metrics.webhook_requests.labels("mutate", "allowed").inc()
    metrics.opportunistic_events.labels("placed").inc()
    metrics.watch_loop(TurnStats())
    return _names(metrics.registry) | _names(Metrics(controller_view()).registry)


def dra_series_names() -> set[str]:
    metrics = Metrics()
    allocator = SimpleNamespace(
        devices=SimpleNamespace(totals=lambda: (1, 1, 30)),
        placed=1,
        left_to_scheduler=0,
        waiting_pods=lambda: (),
    )
    metrics.watch_claims(allocator)  # type: ignore[arg-type]
    return _names(metrics.registry)


def exported() -> set[str]:
    """gpushare's own families (the client library's process_* are standard: the dashboard
    shows CPU and memory of them)."""
    return {name for name in all_series() if name.startswith("gpushare_")}


def all_series() -> set[str]:
    return {
        *exporter_series_names(),
        *controller_series_names(),
        *request_series_names(),
        *node_agent_series_names(),
        *dra_series_names(),
    }


def dashboard_names() -> set[str]:
    names: set[str] = set()
    for path in DASHBOARDS.glob("*.json"):
        board = json.loads(path.read_text())
        for panel in panels(board):
            for target in panel["targets"]:  # type: ignore[attr-defined]
                names.update(_NAME.findall(target["expr"]))
    return names


def test_every_exported_family_is_on_a_dashboard_or_justified() -> None:
    shown = {family(n) for n in dashboard_names()}
    missing = sorted({family(n) for n in exported()} - shown - set(NOT_ON_A_DASHBOARD))
    assert missing == [], f"on no dashboard and not justified here: {missing}"
    # A justification for a family that is on a dashboard after all is stale.
    assert not set(NOT_ON_A_DASHBOARD) & shown


def test_control_plane_dashboard_names_only_exported_series() -> None:
    board = json.loads((DASHBOARDS / "control-plane.json").read_text())
    assert board["uid"] == "gpushare-control-plane"
    known = exported()
    controller = controller_series_names() | request_series_names() | dra_series_names()
    unknown = {}
    for panel in panels(board):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:  # type: ignore[attr-defined]
            used = set(_NAME.findall(target["expr"]))
            if used - known:
                unknown[panel["title"]] = used - known
            if used & controller:
                assert "gpushare controller" in str(panel["description"]), panel["title"]
    assert unknown == {}
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


def test_each_controller_replica_exports_what_its_process_costs() -> None:
    """process_* from every replica (the control-plane dashboard's CPU and memory panel)."""
    names = _names(Metrics().registry)
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= names


def test_the_observability_doc_names_every_dashboard_the_chart_ships_and_counts_them() -> None:
    """docs/observability.md said three dashboards while the chart shipped four (issue 68)."""
    text = (REPO / "docs" / "observability.md").read_text()
    section = text.split("## Dashboards", 1)[1].split("\n## ", 1)[0]
    files = sorted(p.name for p in DASHBOARDS.glob("*.json"))
    words = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
    assert f"holds {words[len(files)]} Grafana dashboards" in section
    for name in files:
        assert f"(`{name}`" in section, name
