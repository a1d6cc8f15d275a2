"""The preempt verb: kube-scheduler's priority preemption evicts only where it makes room.

kube-scheduler counts ``gpushare.io/gpu-percent`` per node (the chart's NodeResourcesFit), so
when a pod fits nowhere it may pick lower-priority pods to evict from a node whose *total* free
share would then be enough. The share is per GPU: evicting a 30% pod from one GPU does not make
room for a 90% pod when no single GPU then has 90% free, and the evicted pod's work would be
thrown away for nothing. Before evicting, kube-scheduler asks this verb; it keeps a candidate
node, with the victims kube-scheduler chose, only when the pod then fits one of its GPUs (or
its whole GPUs), and drops it otherwise. An opted-in pod evicts no other opted-in pod there
(no preemption among equals: docs/packing.md, "The sharing contract"). Pods without GPUs and
their victims are kept as given: kube-scheduler's own fit is exact for CPU and memory.
docs/scheduling.md, "Scheduler extender" (**preempt**).
"""

import logging
from dataclasses import replace
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.cluster.extender.args import PreemptionArgs
from gpushare.cluster.extender.base import ExtenderBase
from gpushare.cluster.state import pods
from gpushare.cluster.state.share_rules import ShareRules
from gpushare.packing.fit import gpus_fit_reason
from gpushare.packing.model import Demand

log = logging.getLogger(__name__)


class PreemptVerbs(ExtenderBase):
    """preempt (``ExtenderPreemptionArgs`` -> ``ExtenderPreemptionResult``)."""

    def preempt(self, args: PreemptionArgs) -> dict[str, Any]:
        """The candidate nodes whose victims make room for the pod, each with those victims."""
        try:
            demand, rules = self._read(args.pod)
        except InvalidInputError as exc:
            log.info("preemption refused: %s", exc, extra={"pod": pods.pod_key(args.pod)})
            return {"NodeNameToMetaVictims": {}}
        kept: dict[str, Any] = {}
        key = pods.pod_key(args.pod)
        for node, (uids, violations) in args.victims.items():
            why = None if demand is None else self._no_room(node, key, demand, rules, set(uids))
            if why is None:
                kept[node] = {
                    "Pods": [{"UID": uid} for uid in uids],
                    "NumPDBViolations": violations,
                }
            else:
                log.info(
                    "preemption on node %s dropped: %s",
                    node,
                    why,
                    extra={"pod": key, "node": node, "victims": len(uids)},
                )
        return {"NodeNameToMetaVictims": kept}

    def _no_room(
        self, name: str, key: str, demand: Demand, rules: ShareRules, uids: set[str]
    ) -> str | None:
        """Why evicting the pods ``uids`` from node ``name`` would not let the pod in; None when
        it would."""
        node, refusal = self._node(name, key, rules)
        if node is None or not node.gpus:
            return refusal or "the node has no gpushare GPUs"
        gpus = []
        for gpu in node.gpus:
            staying = []
            for tenant in gpu.tenants:
                facts = self.view.pod(tenant.key)
                if facts is None or facts.uid not in uids:
                    staying.append(tenant)
                elif demand.opportunistic and tenant.equal:
                    return f"victim {tenant.key} opted in too (no preemption among equals)"
            gpus.append(replace(gpu, tenants=staying) if len(staying) < len(gpu.tenants) else gpu)
        return gpus_fit_reason(replace(node, gpus=gpus), demand)
