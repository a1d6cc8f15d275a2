"""The GpuShare rules of pods with claims, as the claim allocator reads them: what a pod's
annotations and its share impose on the GPUs its claims get, recorded in the ledger so that
its claims' tenants carry them, and whether its share holds it back (docs/dra.md,
"GpuShares and profiles"). Pure: no I/O.
"""

import contextlib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.exclusive import parse_avoid_gpus
from gpushare.api.gpushare_crd import (
    ANN_MAX_PODS_PER_GPU,
    ANN_PACKING_POLICY,
    ANN_PROFILE,
    ANN_PROFILING,
)
from gpushare.api.names import ANN_AVOID_GPUS, ANN_SHARE
from gpushare.api.profile import GpuProfile
from gpushare.cluster.dra import placement
from gpushare.cluster.dra.devices import DraDevices
from gpushare.cluster.dra.waiting import meta
from gpushare.cluster.state.share_rules import NO_RULES, ShareRules, hold_reason, rules_of
from gpushare.cluster.state.view import ClusterView
from gpushare.packing.stored_profile import pipe_profile

RULE_ANNOTATIONS = (ANN_SHARE, ANN_PROFILE, ANN_PROFILING, ANN_PACKING_POLICY, ANN_MAX_PODS_PER_GPU)
"""A pod with none of these has no GpuShare rules (most pods: they are not read further)."""


class PodRules:
    """Reads pods' GpuShare rules and keeps the ledger's claim rules in step with them."""

    def __init__(self, *, view: ClusterView, devices: DraDevices) -> None:
        self.view = view
        self.devices = devices
        self._claims: dict[str, list[str]] = {}
        """Pod key -> the claims given its GpuShare rules in the ledger."""

    def pods(self) -> list[str]:
        """Keys of the pods whose claims carry their rules in the ledger."""
        return list(self._claims)

    def note(self, key: str, pod: Mapping[str, Any]) -> None:
        """Give pod ``key``'s claims its GpuShare rules in the ledger (measured profile,
        profiling alone, exclusive, max pods per GPU: what its tenants impose on a GPU)."""
        annotations = meta(pod).get("annotations")
        if not isinstance(annotations, Mapping) or not any(
            k in annotations for k in RULE_ANNOTATIONS
        ):
            if key in self._claims:
                self.drop(key)
            return
        namespace = key.partition("/")[0]
        rules = self.of(key, pod)
        claims = [
            f"{namespace}/{claim}"
            for _, claim in placement.pod_claim_names(pod)
            if claim is not None
        ]
        for gone in set(self._claims.get(key, ())) - set(claims):
            self.devices.set_claim_rules(gone, NO_RULES)
        self._claims[key] = claims
        readable = rules if isinstance(rules, ShareRules) else NO_RULES
        for claim in claims:
            self.devices.set_claim_rules(claim, readable)

    def drop(self, key: str) -> None:
        """Pod ``key`` is gone or has no rules: its claims carry none from now on."""
        for claim in self._claims.pop(key, ()):
            self.devices.set_claim_rules(claim, NO_RULES)

    def of(self, key: str, pod: Mapping[str, Any]) -> ShareRules | str:
        """The pod's GpuShare rules, or why they cannot be read (a sentence naming the
        annotation and the fix). A pod of a Packed share that does not carry the profile yet
        gets the share's (the operator annotates pods only while they are unscheduled, and
        the hold lifts as the share is Packed: the pod may be placed first)."""
        namespace, _, name = key.partition("/")
        annotations = meta(pod).get("annotations")
        try:
            rules = rules_of(
                name=name,
                namespace=namespace,
                annotations=annotations if isinstance(annotations, Mapping) else {},
                granted=self.view.tenancies.neighbour_rules(namespace),
            )
        except InvalidInputError as exc:
            return str(exc)
        if rules.profile is None and rules.share is not None:
            status = self.view.share_status(namespace, rules.share) or {}
            stored = status.get("profile")
            if isinstance(stored, Mapping):
                with contextlib.suppress(InvalidInputError):
                    rules = replace(rules, profile=pipe_profile(GpuProfile.from_status(stored)))
        return rules

    def hold(self, rules: ShareRules) -> str | None:
        """Why the pod's GpuShare keeps it waiting (gpushare.api.gpushare_crd.scheduling_hold),
        or None."""
        if rules.share is None or self.view.share_skips_profiling(rules.namespace, rules.share):
            return None
        status = self.view.share_status(rules.namespace, rules.share)
        return hold_reason(rules, share_status=status)


def avoid_gpus(pod: Mapping[str, Any]) -> frozenset[str]:
    """GPU UUIDs the pod must not use (``gpushare.io/avoid-gpus``, the webhook's separation
    after faults; docs/reliability.md); raises InvalidInputError when unreadable."""
    annotations = meta(pod).get("annotations")
    return parse_avoid_gpus(
        annotations.get(ANN_AVOID_GPUS) if isinstance(annotations, Mapping) else None
    )


__all__ = ["RULE_ANNOTATIONS", "PodRules", "avoid_gpus"]
