"""Prometheus metrics of the controller, in a registry of its own (no import-time globals).

Two kinds of series. The cluster's state (the view's sizes and pending pods, profiles,
quarantine, opportunistic pods, DRA totals) is the same on every replica, so only the leader
exports it (:class:`_LeaderOnly`): ``sum()`` over all replicas then counts each pod once. What a
replica did itself (webhook and extender requests, binds) and ``gpushare_build_info`` come from
every replica (docs/observability.md, "Series the controller exports").
"""

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gpushare.api.build import (
    BUILD_INFO_HELP,
    BUILD_INFO_LABELS,
    BUILD_INFO_METRIC,
    build_info_values,
)
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import METRIC_PREFIX
from gpushare.api.profile import PIPES, STORED, GpuProfile
from gpushare.cluster.dra.allocator import ClaimAllocator
from gpushare.cluster.event_loop import TURN_BUCKETS, TurnStats
from gpushare.cluster.state.view import ClusterView

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
)  # fmt: skip


class _LeaderOnly(Collector):
    """``inner``'s series while ``leading()``, none on a standby. Described (names checked
    for clashes when registered) whether leading or not."""

    def __init__(self, inner: Collector, leading: Callable[[], bool]) -> None:
        self._inner = inner
        self._leading = leading

    def describe(self) -> Iterable[Metric]:
        return list(self._inner.collect())

    def collect(self) -> Iterable[Metric]:
        return self._inner.collect() if self._leading() else ()


class _ViewCollector(Collector):
    """Sizes of the view, read at scrape time."""

    def __init__(
        self,
        view: Callable[[], ClusterView | None],
        gated: Callable[[], Iterable[str]] = lambda: (),
    ) -> None:
        self._view = view
        self._gated = gated

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
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
        yield _pending_pods(view, self._gated())
        yield _share_profiles(view)
        yield from _quarantined(view)
        yield _opportunistic_pods(view)


def _opportunistic_pods(view: ClusterView) -> GaugeMetricFamily:
    """Pods running beyond their GPU's guaranteed capacity now, per namespace and state."""
    family = GaugeMetricFamily(
        f"{METRIC_PREFIX}opportunistic_pods",
        "gpushare pods placed beyond their GPU's guaranteed capacity (preemptible), not yet "
        "promoted, by state: running, pausing (asked to pause, the node agent has not "
        "reported the freeze yet) or paused (frozen, holding its GPU memory)",
        labels=["namespace", "state"],
    )
    counts: dict[tuple[str, str], int] = {}
    for key in view.opportunistic_pods():
        facts = view.pod(key)
        state = "running"
        if facts is not None and facts.pause is not None:
            frozen = facts.paused is not None and facts.paused.request_since == facts.pause.since
            state = "paused" if frozen else "pausing"
        label = (key.split("/", 1)[0], state)
        counts[label] = counts.get(label, 0) + 1
    for label, count in sorted(counts.items()):
        family.add_metric(list(label), count)
    return family


def _quarantined(view: ClusterView) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """Watched objects held out of the view (gpushare.cluster.state.quarantine), per kind."""
    held = GaugeMetricFamily(
        f"{METRIC_PREFIX}controller_quarantined_objects",
        "Watched objects the controller could not read and holds out of scheduling",
        labels=["kind"],
    )
    for kind, count in sorted(view.quarantine.counts().items()):
        held.add_metric([kind], count)
    yield held
    total = CounterMetricFamily(
        f"{METRIC_PREFIX}controller_quarantined",
        "Times a watched object could not be read and was held out",
        labels=["kind"],
    )
    for kind, count in sorted(view.quarantine.total.items()):
        total.add_metric([kind], count)
    yield total


def _pending_pods(view: ClusterView, gated: Iterable[str] = ()) -> GaugeMetricFamily:
    """gpushare pods not yet bound to a node, per namespace: the queue a user waits in (the
    cluster dashboard's "Pending fractional pods"). ``gated``: DRA-mode pods waiting for the
    claim allocator (keys), which the view does not keep. Pods held by another scheduling gate
    (a queue's, such as Kueue's) wait for that queue, not for a GPU: not counted."""
    family = GaugeMetricFamily(
        f"{METRIC_PREFIX}pending_pods",
        "gpushare pods not yet bound to a node",
        labels=["namespace"],
    )
    counts: dict[str, int] = {}
    pending = (
        key
        for key, pod in view.pods().items()
        if pod.node is None and not pod.finished and not pod.gated
    )
    for key in {*pending, *gated}:
        namespace = key.split("/", 1)[0]
        counts[namespace] = counts.get(namespace, 0) + 1
    for namespace, count in sorted(counts.items()):
        family.add_metric([namespace], count)
    return family


_PROFILE_PIPES = tuple(p for p in PIPES if p in STORED)
"""The pipes a stored profile keeps (``status.profile`` keys are the pipe label's values)."""


def _share_profiles(view: ClusterView) -> GaugeMetricFamily:
    """Each profiled GpuShare's measured pipe use (``status.profile``; docs/operator.md), for
    the workload dashboard. A profile the operator has not written yet, or one that does not
    parse, is left out rather than failing the scrape."""
    family = GaugeMetricFamily(
        f"{METRIC_PREFIX}share_profile_pipe_ratio",
        "Pipe utilization measured when the GpuShare's job was profiled alone on a GPU",
        labels=["namespace", "gpushare", "pipe", "gpu_model", "simulated"],
    )
    for key, status in sorted(view.share_statuses().items()):
        raw = status.get("profile")
        if not isinstance(raw, dict) or not raw:
            continue
        try:
            profile = GpuProfile.from_status(raw)
        except InvalidInputError:
            continue
        namespace, name = key.split("/", 1)
        simulated = "true" if profile.simulated else "false"
        for pipe in _PROFILE_PIPES:
            value = getattr(profile, pipe)
            if value is not None:
                family.add_metric([namespace, name, pipe, profile.gpu_model, simulated], value)
    return family


class _DraCollector(Collector):
    """DRA mode, read at scrape time: the GPUs the node agents publish as ResourceSlices, the
    claims allocated on them (whoever placed them) and what the claim allocator did."""

    def __init__(self, allocator: ClaimAllocator) -> None:
        self._allocator = allocator

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        gpus, claims, percent = self._allocator.devices.totals()
        for name, help_text, value in (
            ("controller_dra_gpus", "GPUs in gpushare's ResourceSlices (DRA mode)", gpus),
            (
                "controller_dra_claims",
                "Allocated ResourceClaims on gpushare's DRA GPUs",
                claims,
            ),
            (
                "controller_dra_allocated_percent",
                "gpuPercent the allocated claims consume, summed over gpushare's DRA GPUs "
                "(divide by 100 x controller_dra_gpus for the share of DRA capacity in use)",
                percent,
            ),
        ):
            family = GaugeMetricFamily(f"{METRIC_PREFIX}{name}", help_text)
            family.add_metric([], value)
            yield family
        for name, help_text, count in (
            (
                "dra_claims_placed",
                "Claims the controller allocated (DRA mode, gpushare placement)",
                self._allocator.placed,
            ),
            (
                "dra_claims_left_to_scheduler",
                "Claims the controller left to kube-scheduler (the API server refused its write)",
                self._allocator.left_to_scheduler,
            ),
        ):
            counter = CounterMetricFamily(f"{METRIC_PREFIX}{name}", help_text)
            counter.add_metric([], count)
            yield counter


class _LoopCollector(Collector):
    """The controller's event-loop turns (gpushare.cluster.event_loop), read at scrape time."""

    def __init__(self, turns: TurnStats) -> None:
        self._turns = turns

    def collect(self) -> Iterator[Metric]:
        t = self._turns
        buckets, total = [], 0
        for bound, count in zip((*map(str, TURN_BUCKETS), "+Inf"), t.counts, strict=True):
            total += count
            buckets.append((bound, float(total)))
        yield HistogramMetricFamily(
            f"{METRIC_PREFIX}controller_loop_turn_seconds",
            "Time the controller's event loop ran callbacks between two polls (a request "
            "arriving meanwhile waits for the turn to end)",
            buckets=buckets,
            sum_value=t.busy_s,
        )
        yield CounterMetricFamily(
            f"{METRIC_PREFIX}controller_loop_delay_seconds",
            "Sum over the loop's turns of T^2/2 (T: the turn's length): its rate is the mean "
            "time a request arriving at a random moment waits for the turn in progress",
            value=t.delay_s,
        )


class Metrics:
    def __init__(self, view: ClusterView | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.leading: Callable[[], bool] = lambda: True
        """Does this replica export the cluster's state: the controller points it at its
        leadership (``ControllerContext``); a process without leader election always does."""
        Gauge(BUILD_INFO_METRIC, BUILD_INFO_HELP, BUILD_INFO_LABELS, registry=self.registry).labels(
            *build_info_values("controller")
        ).set(1)
        # process_cpu_seconds_total, process_resident_memory_bytes, open fds, start time: what
        # a replica costs (the control-plane dashboard), every replica.
        ProcessCollector(registry=self.registry)
        self._extender_metrics()
        self._admission_metrics()
        self._view = view
        self._allocator: ClaimAllocator | None = None
        self.registry.register(
            _LeaderOnly(
                _ViewCollector(
                    lambda: self._view,
                    gated=lambda: self._allocator.waiting_pods() if self._allocator else (),
                ),
                self._exports_state,
            )
        )

    def _extender_metrics(self) -> None:
        """kube-scheduler's calls: time and outcome per verb, the bind's stages and results."""
        self.extender_seconds = self._latency(
            "extender_request_duration_seconds",
            "Time to answer one kube-scheduler extender call",
            ["verb"],
        )
        self.extender_requests = self._counter(
            "extender_requests",
            "Extender calls by verb and outcome (ok, error, bad_request)",
            ["verb", "outcome"],
        )
        self.bind_stage_seconds = self._latency(
            "extender_bind_stage_seconds",
            "Time a bind spends per stage: gate (waiting until no pod of its size on the node "
            "still waits for its Allocate) and write (choosing GPUs and the Binding POST)",
            ["stage"],
        )
        self.binds = self._counter(
            "extender_binds", "Bind attempts by result (bound, failed)", ["result"]
        )

    def _admission_metrics(self) -> None:
        """Admission reviews, and what opportunistic placement did."""
        self.webhook_seconds = self._latency(
            "webhook_request_duration_seconds",
            "Time to answer one admission review (the API server waits webhook.timeoutSeconds, "
            "then refuses the pod: the webhook fails closed)",
            ["webhook"],
        )
        self.webhook_requests = self._counter(
            "webhook_requests",
            "Admission reviews by webhook (mutate, validate) and outcome (allowed, denied, "
            "bad_request)",
            ["webhook", "outcome"],
        )
        self.opportunistic_events = self._counter(
            "opportunistic_events",
            "Opportunistic placement: pods placed beyond a GPU's guaranteed capacity (placed), "
            "promoted to guaranteed (promoted), paused (reason guaranteed-needs-room: a "
            "guaranteed pod needed the compute; harm: the governor measured harm to a "
            "neighbour), resumed, and evicted (reason memory or mps-clients: what a guaranteed "
            "pod needed and no pause frees)",
            ["event", "reason"],
        )

    def _latency(self, name: str, help_text: str, labels: list[str]) -> Histogram:
        """A time histogram of this registry, on the buckets every latency here shares."""
        return Histogram(
            f"{METRIC_PREFIX}{name}",
            help_text,
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

    def _counter(self, name: str, help_text: str, labels: list[str]) -> Counter:
        return Counter(f"{METRIC_PREFIX}{name}", help_text, labels, registry=self.registry)

    def _exports_state(self) -> bool:
        return self.leading()  # read at scrape time: ``leading`` is replaced after __init__

    def watch_loop(self, turns: TurnStats) -> None:
        """Report the event loop's turns (every replica: it is this process's own loop)."""
        self.registry.register(_LoopCollector(turns))

    def watch_claims(self, allocator: ClaimAllocator) -> None:
        """Report DRA mode's GPUs, claims and placements (the controller places claims), and
        count its gated pods as pending."""
        self._allocator = allocator
        self.registry.register(_LeaderOnly(_DraCollector(allocator), self._exports_state))
