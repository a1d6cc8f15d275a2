"""kube-scheduler's default profile, for the pods gpushare does not place.

A pod that asks for no GPU never reaches the gpushare extender (its ``managedResources`` is
``gpushare.io/gpu-percent``): in a cluster with gpushare installed the stock default-scheduler
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
from collections.abc import Sequence

from gpushare.packing.model import Demand, NodeState

MAX_NODE_SCORE = 100
MIN_FEASIBLE_NODES = 100
MIN_FEASIBLE_PERCENT = 5


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


class StockScheduler:
    """The default-scheduler's node choice for pods without GPUs (see the module docstring)."""

    def __init__(
        self,
        *,
        cpu_milli: Sequence[int],
        memory_bytes: Sequence[int],
        rng: random.Random,
        percentage: int | None = None,
    ) -> None:
        self.cpu_allocatable = list(cpu_milli)
        self.memory_allocatable = list(memory_bytes)
        self.rng = rng
        self.to_find = feasible_nodes_to_find(len(self.cpu_allocatable), percentage)
        self.next_start = 0

    def pick(self, nodes: Sequence[NodeState], demand: Demand) -> int | None:
        """The node kube-scheduler binds ``demand`` to; None when none fits."""
        n = len(nodes)
        best: list[int] = []
        best_score = -1
        found = processed = 0
        for k in range(n):
            if found >= self.to_find:
                break
            i = (self.next_start + k) % n
            processed += 1
            node = nodes[i]
            cpu_free = node.cpu_milli_free or 0
            memory_free = node.memory_free_bytes or 0
            if demand.cpu_milli > cpu_free or demand.host_memory_bytes > memory_free:
                continue
            found += 1
            score = self._score(i, node, demand)
            if score > best_score:
                best, best_score = [i], score
            elif score == best_score:
                best.append(i)
        self.next_start = (self.next_start + processed) % max(n, 1)
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
