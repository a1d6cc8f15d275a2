"""Metrics of fault handling: the counters the monitor keeps (:class:`FaultStats`) and the
``gpushare_mps_fault_*`` series made of them (:class:`FaultCollector`)."""

from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpushare.api.exclusive import ExclusiveWorkload


@dataclass
class FaultStats:
    """What fault handling counted, for :class:`FaultCollector`."""

    incidents: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    """(gpu uuid, attributed yes|no) -> incidents."""
    clients: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    """(gpu uuid, role) -> clients, role faulting (named by the MPS server) | victim (another
    client torn down with it) | unattributed (torn down; the server named no client)."""
    detection_s: dict[str, float] = field(default_factory=dict)
    recovery_s: dict[str, float] = field(default_factory=dict)
    """GPU -> seconds from the last fault to its last affected client leaving the server."""
    lingering: int = 0
    """Affected clients that kept their broken context past the grace period."""
    evicted: int = 0
    evicted_lingering: int = 0
    separated: int = 0
    """Pods evicted (not marked exclusive) to separate workloads that keep faulting together."""


class FaultCollector(Collector):
    """``gpushare_mps_fault_*`` series of one node."""

    def __init__(
        self, *, node_name: str, stats: FaultStats, exclusive: Mapping[str, ExclusiveWorkload]
    ) -> None:
        self.node_name = node_name
        self.stats = stats
        self.exclusive = exclusive
        """Workload UID -> its mark for a GPU of its own (the monitor's, read at collect)."""

    def collect(self) -> Iterator[Metric]:
        """Every ``gpushare_mps_fault_*`` series (and the exclusive workloads), built at
        scrape time from the counters."""
        yield from self._involvement_families(self.node_name)
        yield from self._timing_families(self.node_name)
        yield from self._node_families(self.node_name)

    def _involvement_families(self, node: str) -> Iterator[Metric]:
        """Fault incidents and the clients involved in them, per GPU."""
        yield _per_gpu(
            CounterMetricFamily(
                "gpushare_mps_fault_incidents",
                "Fatal GPU faults of MPS clients seen in the MPS server logs; attributed=yes when "
                "the log named a client (evidence, not proof: on driver 580 the named client was "
                "the real faulter about half the time).",
                labels=["node", "gpu_uuid", "attributed"],
            ),
            node,
            self.stats.incidents,
        )
        yield _per_gpu(
            CounterMetricFamily(
                "gpushare_mps_fault_clients",
                "MPS clients involved in fatal GPU faults (torn down by them), by role: faulting "
                "(named by the MPS server, right about half the time on driver 580), victim "
                "(another client torn down with it), unattributed (the log named no client).",
                labels=["node", "gpu_uuid", "role"],
            ),
            node,
            self.stats.clients,
        )

    def _timing_families(self, node: str) -> Iterator[Metric]:
        """Seconds to detect a fault and to recover from it, per GPU."""
        yield _per_gpu(
            GaugeMetricFamily(
                "gpushare_mps_fault_detection_seconds",
                "Time from the last fault being logged by the MPS server to the node agent acting.",
                labels=["node", "gpu_uuid"],
            ),
            node,
            self.stats.detection_s,
        )
        yield _per_gpu(
            GaugeMetricFamily(
                "gpushare_mps_fault_recovery_seconds",
                "Time from the last fault to the last client it reached leaving the MPS server "
                "(the server takes new clients again).",
                labels=["node", "gpu_uuid"],
            ),
            node,
            self.stats.recovery_s,
        )

    def _node_families(self, node: str) -> Iterator[Metric]:
        """The node's exclusive workloads and its eviction and lingering-client counters."""
        exclusive = GaugeMetricFamily(
            "gpushare_exclusive_workloads",
            "Workloads this node marked for a GPU of their own: each involved in repeated faults "
            "whose other involved workloads had nothing in common.",
            labels=["node"],
        )
        exclusive.add_metric([node], float(len(self.exclusive)))
        yield exclusive
        for name, value, help_text in (
            (
                "gpushare_mps_fault_evictions",
                self.stats.evicted,
                "Pods evicted from a shared GPU to get one of their own.",
            ),
            (
                "gpushare_mps_fault_separations",
                self.stats.separated,
                "Pods evicted, not marked exclusive, to separate workloads that keep faulting "
                "together (which one faults cannot be told until they fault apart).",
            ),
            (
                "gpushare_mps_fault_lingering_clients",
                self.stats.lingering,
                "Clients a fault broke that kept their context past the grace period (they block "
                "the GPU's MPS server for new clients).",
            ),
            (
                "gpushare_mps_fault_lingering_evictions",
                self.stats.evicted_lingering,
                "Pods evicted because they kept a broken MPS client.",
            ),
        ):
            counter = CounterMetricFamily(name, help_text, labels=["node"])
            counter.add_metric([node], float(value))
            yield counter


def _per_gpu(
    family: CounterMetricFamily | GaugeMetricFamily,
    node: str,
    values: Mapping[str, float] | Mapping[tuple[str, str], int],
) -> Metric:
    """``family`` with a sample per key of ``values``: a GPU UUID, or (GPU UUID, the family's
    last label), in order."""
    for key, value in sorted(values.items()):
        family.add_metric([node, *((key,) if isinstance(key, str) else key)], float(value))
    return family
