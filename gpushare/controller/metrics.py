"""Prometheus metrics of the controller, in a registry of its own (no import-time globals)."""

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpushare.api.names import METRIC_PREFIX
from gpushare.controller.view import ClusterView

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
)  # fmt: skip


class _ViewCollector(Collector):
    """Sizes of the view, read at scrape time."""

    def __init__(self, view: Callable[[], ClusterView | None]) -> None:
        self._view = view

    def collect(self) -> Iterator[GaugeMetricFamily]:
        view = self._view()
        if view is None:
            return
        nodes = GaugeMetricFamily(
            f"{METRIC_PREFIX}controller_nodes", "Nodes with a gpushare GPU inventory in the view"
        )
        nodes.add_metric([], len(view.nodes()))
        yield nodes
        gpus = GaugeMetricFamily(f"{METRIC_PREFIX}controller_gpus", "GPUs in the view")
        gpus.add_metric([], sum(len(n.gpus) for n in view.nodes().values()))
        yield gpus
        pods = GaugeMetricFamily(f"{METRIC_PREFIX}controller_pods", "gpushare pods in the view")
        pods.add_metric([], len(view.pods()))
        yield pods
        synced = GaugeMetricFamily(
            f"{METRIC_PREFIX}controller_view_synced", "1 once nodes and pods were listed"
        )
        synced.add_metric([], 1.0 if view.synced else 0.0)
        yield synced


class Metrics:
    def __init__(self, view: ClusterView | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.extender_seconds = Histogram(
            f"{METRIC_PREFIX}extender_request_duration_seconds",
            "Time to answer one kube-scheduler extender call",
            ["verb"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.extender_requests = Counter(
            f"{METRIC_PREFIX}extender_requests",
            "Extender calls by verb and outcome (ok, error, bad_request)",
            ["verb", "outcome"],
            registry=self.registry,
        )
        self.bind_stage_seconds = Histogram(
            f"{METRIC_PREFIX}extender_bind_stage_seconds",
            "Time a bind spends per stage: gate (waiting until no pod of its size on the node "
            "still waits for its Allocate) and write (choosing GPUs and the Binding POST)",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.binds = Counter(
            f"{METRIC_PREFIX}extender_binds",
            "Bind attempts by result (bound, failed)",
            ["result"],
            registry=self.registry,
        )
        self.webhook_requests = Counter(
            f"{METRIC_PREFIX}webhook_requests",
            "Admission reviews by webhook (mutate, validate) and outcome (allowed, denied, "
            "bad_request)",
            ["webhook", "outcome"],
            registry=self.registry,
        )
        self._view = view
        self.registry.register(_ViewCollector(lambda: self._view))
