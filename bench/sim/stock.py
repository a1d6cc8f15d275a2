"""kube-scheduler's default profile, for the pods gpushare does not place.

A pod that asks for no GPU keeps its ``schedulerName`` (the webhook sets gpushare-scheduler only
on pods that ask for a GPU share): in a cluster with gpushare installed the stock default-scheduler
places it, and the openb replay (``bench/replay``) creates such pods exactly so. To compare with
the replay the simulator places them the same way, as kube-scheduler v1.34's default plugins do
for a bare pod with CPU and memory requests:

- filter: CPU and memory fit (NodeResourcesFit); kube-scheduler stops after finding
  ``numFeasibleNodesToFind`` feasible nodes, scanning from where the previous pod stopped
  (adaptive percentage: ``50 - nodes/125`` percent, at least 100 nodes);
- score: NodeResourcesFit ``LeastAllocated`` over CPU and memory (weight 1) plus
  NodeResourcesBalancedAllocation (weight 1); the other default plugins score every node alike
  for such a pod;
- ties: a uniformly random node among the best (kube-scheduler's reservoir sampling).

Only the choice of node is modelled, not timing; the scan order is node-name order.
"""

import random
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from gpushare.packing.model import Demand, NodeState

CHART_VALUES = Path(__file__).resolve().parents[2] / "helm" / "gpushare" / "values.yaml"
MAX_NODE_SCORE = 100
MIN_FEASIBLE_NODES = 100
MIN_FEASIBLE_PERCENT = 5


def chart_nodes_percent(values: Path = CHART_VALUES) -> int | None:
    """``percentageOfNodesToScore`` of the gpushare-scheduler profile as the chart installs it
    (None: kube-scheduler's adaptive default); the simulator and the replay both use it."""
    doc = yaml.safe_load(values.read_text())
    value = (doc.get("scheduler") or {}).get("percentageOfNodesToScore")
    return int(value) if isinstance(value, int) and value > 0 else None


def feasible_nodes_to_find(all_nodes: int, percentage: int | None = None) -> int:
    """kube-scheduler's ``numFeasibleNodesToFind`` (None or 0: the adaptive percentage)."""
    if all_nodes < MIN_FEASIBLE_NODES:
        return all_nodes
    percent = percentage or max(50 - all_nodes // 125, MIN_FEASIBLE_PERCENT)
    return max(all_nodes * percent // 100, MIN_FEASIBLE_NODES)


def _least_allocated(requested: int, capacity: int) -> int:
    if capacity <= 0 or requested > capacity:
        return 0
    return (capacity - requested) * MAX_NODE_SCORE // capacity


class NodeWindow:
    """The nodes kube-scheduler offers for one pod: it scans from where the previous pod's scan
    stopped and stops after ``numFeasibleNodesToFind`` feasible nodes (its own filters:
    resources, affinity); only those are scored, or sent to an extender."""

    def __init__(self, nodes: int, percentage: int | None = None) -> None:
        self.nodes = nodes
        self.to_find = feasible_nodes_to_find(nodes, percentage)
        self.next_start = 0

    def candidates(self, feasible: Callable[[int], bool]) -> list[int]:
        found: list[int] = []
        processed = 0
        for k in range(self.nodes):
            if len(found) >= self.to_find:
                break
            i = (self.next_start + k) % self.nodes
            processed += 1
            if feasible(i):
                found.append(i)
        self.next_start = (self.next_start + processed) % max(self.nodes, 1)
        return found


class StockScheduler:
    """The default-scheduler's node choice for pods without GPUs (see the module docstring)."""

    def __init__(
        self,
        *,
        cpu_milli: Sequence[int],
        memory_bytes: Sequence[int],
        rng: random.Random,
        window: NodeWindow | None = None,
    ) -> None:
        self.cpu_allocatable = list(cpu_milli)
        self.memory_allocatable = list(memory_bytes)
        self.rng = rng
        self.window = window or NodeWindow(len(self.cpu_allocatable))
        """The scheduler's scan position (shared by every pod the same scheduler places)."""

    def pick(self, nodes: Sequence[NodeState], demand: Demand) -> int | None:
        """The node kube-scheduler binds ``demand`` to; None when none fits."""

        def fits(i: int) -> bool:
            node = nodes[i]
            return demand.cpu_milli <= (node.cpu_milli_free or 0) and (
                demand.host_memory_bytes <= (node.memory_free_bytes or 0)
            )

        best: list[int] = []
        best_score = -1
        for i in self.window.candidates(fits):
            score = self._score(i, nodes[i], demand)
            if score > best_score:
                best, best_score = [i], score
            elif score == best_score:
                best.append(i)
        if not best:
            return None
        return best[self.rng.randrange(len(best))] if len(best) > 1 else best[0]

    def _score(self, i: int, node: NodeState, demand: Demand) -> int:
        cpu_cap, memory_cap = self.cpu_allocatable[i], self.memory_allocatable[i]
        cpu_req = cpu_cap - (node.cpu_milli_free or 0) + demand.cpu_milli
        memory_req = memory_cap - (node.memory_free_bytes or 0) + demand.host_memory_bytes
        least = (_least_allocated(cpu_req, cpu_cap) + _least_allocated(memory_req, memory_cap)) // 2
        cpu_fraction = min(cpu_req / cpu_cap, 1.0) if cpu_cap > 0 else 1.0
        memory_fraction = min(memory_req / memory_cap, 1.0) if memory_cap > 0 else 1.0
        balanced = int((1.0 - abs(cpu_fraction - memory_fraction) / 2) * MAX_NODE_SCORE)
        return least + balanced
