"""What filter offered each pod, so bind places a pod only on a node filter chose for it.

kube-scheduler binds a pod to one of the nodes the extender's filter passed for it moments
before. A bind for any other node (a forged call, or a node the pod's own scheduling rules
exclude: node affinity, taints, host resources, which the extender does not check) is refused.
Entries expire and their number is bounded, so a flood of filter calls cannot grow memory.
"""

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

OFFER_SECONDS = 120.0
"""An offer older than this no longer allows a bind (the scheduler filters again)."""
MAX_OFFERS = 20_000
"""Pods remembered at once; the oldest offers go first."""


class Offers:
    """Pod (key and UID) -> the nodes filter passed for it, and when."""

    def __init__(
        self,
        *,
        ttl_s: float = OFFER_SECONDS,
        limit: int = MAX_OFFERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.limit = limit
        self.clock = clock
        self._offers: OrderedDict[str, tuple[str, frozenset[str], float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._offers)

    def offer(self, key: str, uid: str, nodes: Iterable[str]) -> None:
        self._offers.pop(key, None)
        self._offers[key] = (uid, frozenset(nodes), self.clock())
        while len(self._offers) > self.limit:
            self._offers.popitem(last=False)

    def offered(self, key: str, uid: str, node: str) -> bool:
        """Did a filter for this pod pass ``node`` within the offer's lifetime?"""
        found = self._offers.get(key)
        if found is None:
            return False
        offered_uid, nodes, at = found
        if self.clock() - at > self.ttl_s:
            del self._offers[key]
            return False
        return node in nodes and (not uid or not offered_uid or uid == offered_uid)

    def forget(self, key: str) -> None:
        self._offers.pop(key, None)
