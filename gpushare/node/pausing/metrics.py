"""Metrics of pausing (docs/observability.md): ``gpushare_pod_pauses_total``,
``gpushare_pod_resumes_total``, ``gpushare_pod_pause_failures_total``,
``gpushare_pod_paused_seconds_total`` and ``gpushare_pods_paused``, made at scrape time from
the pause loop's :class:`~gpushare.node.pausing.pauser.PauseStats`."""

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpushare.api.pause import REASONS
from gpushare.node.pausing.decisions import MALFORMED, TERMINATING, WITHDRAWN
from gpushare.node.pausing.pauser import PauseStats

RESUME_REASONS = (WITHDRAWN, TERMINATING, MALFORMED)
"""Why a frozen pod was thawed (each series exported from 0)."""


class PauseCollector(Collector):
    """The pause series of one node."""

    def __init__(
        self, *, node_name: str, stats: PauseStats, clock: Callable[[], float] = time.time
    ) -> None:
        self.node_name = node_name
        self.stats = stats
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        node, stats = self.node_name, self.stats
        pauses = CounterMetricFamily(
            "gpushare_pod_pauses",
            "Pods this node agent paused (froze their containers) at the gpushare controller's "
            "request, by the request's reason.",
            labels=["node", "reason"],
        )
        for reason in sorted({*REASONS, *stats.pauses}):
            pauses.add_metric([node, reason], float(stats.pauses.get(reason, 0)))
        yield pauses
        resumes = CounterMetricFamily(
            "gpushare_pod_resumes",
            "Paused pods this node agent resumed (thawed), by why: withdrawn (the controller "
            "withdrew the request), terminating (the pod is being deleted), malformed (the "
            "request could not be read).",
            labels=["node", "reason"],
        )
        for reason in sorted({*RESUME_REASONS, *stats.resumes}):
            resumes.add_metric([node, reason], float(stats.resumes.get(reason, 0)))
        yield resumes
        failures = CounterMetricFamily(
            "gpushare_pod_pause_failures",
            "Pauses and resumes that failed, by operation (pause | resume) and reason "
            "(no-cgroup-fs, write-failed, not-settled, api, malformed, not-gpushare).",
            labels=["node", "operation", "reason"],
        )
        for (operation, reason), value in sorted(stats.failures.items()):
            failures.add_metric([node, operation, reason], float(value))
        yield failures
        seconds = CounterMetricFamily(
            "gpushare_pod_paused_seconds",
            "Seconds pods on this node spent paused since the node agent started (pods frozen "
            "now included).",
            labels=["node"],
        )
        seconds.add_metric([node], stats.paused_seconds(self.clock()))
        yield seconds
        paused = GaugeMetricFamily(
            "gpushare_pods_paused", "Pods on this node paused now.", labels=["node"]
        )
        paused.add_metric([node], float(len(stats.frozen_since)))
        yield paused
