"""The claim allocator's decision for one claim: the demand of the claim and its pod, the
search's choice of node and GPUs, and the allocation counted in the ledger (and the pod's host
room held) the moment it is decided, before its writes go out. Pure: no I/O.
"""

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpushare.cluster.dra import placement, search
from gpushare.cluster.dra.devices import DraDevices
from gpushare.cluster.dra.waiting import HostHolds, Waiting
from gpushare.cluster.state.host_resources import pod_requests
from gpushare.cluster.state.share_rules import ShareRules, with_profile
from gpushare.cluster.state.view import ClusterView
from gpushare.packing.model import Demand
from gpushare.packing.placer import Placer

log = logging.getLogger(__name__)

MAX_DEMANDS = 10_000
"""Distinct claim shapes interned before starting over."""


class ClaimDecider:
    """Decides claims one at a time, keeping across claims what makes the next search cheap:
    the costs already known, where the next search starts, one Demand per claim shape."""

    def __init__(
        self, *, view: ClusterView, devices: DraDevices, placer: Placer, hosts: HostHolds
    ) -> None:
        self.view = view
        self.devices = devices
        self.placer = placer
        self.hosts = hosts
        self._costs = search.CostMemo()
        self._start = 0
        """Where the next search for a node begins (rotated like kube-scheduler's)."""
        self._demands: dict[Demand, Demand] = {}
        """One Demand object per claim shape (the placer's memo looks them up by identity)."""

    def decide(
        self,
        key: str,
        waiting: Waiting,
        claim_key: str,
        claim: Mapping[str, Any],
        ask: placement.ClaimAsk,
        *,
        rules: ShareRules,
        class_configs: Sequence[Mapping[str, Any]],
    ) -> dict[str, Any] | str:
        """The claim's allocation, counted in the ledger (and the pod's host room held) from
        now on; or, when no GPU has room, why (the sentence the pod's event says). ``rules``:
        the pod's GpuShare rules; its measured profile goes into the demand, so the
        interference check weighs it against the tenants' (docs/dra.md, "GpuShares and
        profiles")."""
        want = self._demand(key, waiting, ask, rules)
        started = time.monotonic()
        choice = self._choose(want, rules)
        if not isinstance(choice, search.Choice):
            why = "; ".join(f"{n} node(s): {r}" for r, n in sorted(choice.items()))
            return f"claim {claim_key} fits no GPU yet: {why}"
        self._start += choice.examined
        body = placement.allocation(claim, ask, choice, class_configs=class_configs)
        self._count(key, waiting, claim_key, claim, body=body, choice=choice, want=want)
        log.info(
            "claim placed",
            extra={
                "pod": key,
                "claim": claim_key,
                "node": choice.assignment.node,
                "gpus": ",".join(f"{g.pool}/{g.device}" for g in choice.gpus),
                "percent": ask.percent,
                "profiled": want.profile is not None,
                "decide_ms": round((time.monotonic() - started) * 1000, 2),
            },
        )
        return body

    def _demand(
        self, key: str, waiting: Waiting, ask: placement.ClaimAsk, rules: ShareRules
    ) -> Demand:
        """What the placer is asked: the claim's ask with the pod's host requests, tenancy,
        measured profile and GPUs to avoid; one object per shape (fast memo lookups)."""
        cpu, memory = pod_requests(waiting.pod)
        want = with_profile(
            placement.demand(
                ask,
                cpu_milli=cpu,
                memory_bytes=memory,
                tenancy=self.view.tenancies.tenancy(key.partition("/")[0]),
            ),
            rules,
        )
        if waiting.avoid:  # a workload separated after faults (docs/reliability.md)
            want = replace(want, avoid_gpus=waiting.avoid)
        want = self._demands.setdefault(want, want)
        if len(self._demands) > MAX_DEMANDS:
            self._demands.clear()
        return want

    def _choose(self, want: Demand, rules: ShareRules) -> search.Choice | dict[str, int]:
        """The search's answer for ``want`` over the ledger, the view's host room less what
        pods placed here and not bound hold, and the nodes whose agents are gone."""
        return search.choose(
            self.placer,
            self.devices,
            want,
            tenancy_of=self.view.tenancies.tenancy,
            host_free=self.view.host_free_room,
            held=self.hosts.on,
            start=self._start,
            memo=self._costs,
            rules=rules,
            gone=self.view.agents.nodes_down,
        )

    def _count(
        self,
        key: str,
        waiting: Waiting,
        claim_key: str,
        claim: Mapping[str, Any],
        *,
        body: dict[str, Any],
        choice: search.Choice,
        want: Demand,
    ) -> None:
        """Count the allocation ``body`` in the ledger as assumed, note where the pod goes
        and hold its host room there: the next decision sees both before any write."""
        status = claim.get("status")
        self.devices.assume(
            claim_key,
            {
                **claim,
                "status": {**(status if isinstance(status, Mapping) else {}), "allocation": body},
            },
        )
        waiting.gpus = (*waiting.gpus, *(g.uuid for g in choice.gpus))
        waiting.node = choice.assignment.node
        self.hosts.hold(key, choice.assignment.node, want.cpu_milli, want.host_memory_bytes)
