"""GpuShares as the view knows them: each share's watched status and spec
(:class:`ShareRegistry`), and the rules its pods carry in their annotations (:class:`PodRules`,
read by ``share_rules``)."""

from collections.abc import Iterable, Mapping
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.gpushare_crd import PROFILING_SKIP, parse_spec
from gpushare.api.request import GpuRequest
from gpushare.cluster.state.pods import annotations, metadata
from gpushare.cluster.state.share_rules import NO_RULES, ShareRules, rules_of


class ShareRegistry:
    """Every watched GpuShare's status, the request it stands for, and whether it skips
    profiling, by ``namespace/name``."""

    def __init__(self) -> None:
        self.statuses: dict[str, Mapping[str, Any]] = {}
        self._requests: dict[str, GpuRequest | None] = {}
        self._without_profiling: set[str] = set()

    def upsert(self, share: Mapping[str, Any]) -> None:
        meta = share.get("metadata")
        if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
            return
        status = share.get("status")
        key = f"{meta.get('namespace') or 'default'}/{meta['name']}"
        self.statuses[key] = dict(status) if isinstance(status, Mapping) else {}
        spec = share.get("spec")
        self._requests[key] = _share_request(spec, name=str(meta["name"]))
        profiling = spec.get("profiling") if isinstance(spec, Mapping) else None
        mode = profiling.get("mode") if isinstance(profiling, Mapping) else None
        if mode == PROFILING_SKIP:
            self._without_profiling.add(key)
        else:
            self._without_profiling.discard(key)

    def delete(self, share: Mapping[str, Any]) -> None:
        meta = share.get("metadata")
        if isinstance(meta, Mapping):
            key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
            self.statuses.pop(key, None)
            self._requests.pop(key, None)
            self._without_profiling.discard(key)

    def replace(self, shares: Iterable[Mapping[str, Any]]) -> None:
        """A full list: shares missing from it are gone."""
        self.statuses.clear()
        self._requests.clear()
        self._without_profiling.clear()
        for share in shares:
            self.upsert(share)

    def request(self, namespace: str, name: str) -> GpuRequest | None:
        """The request a GpuShare stands for, from its spec as watched; None when there is no
        such share or its spec is invalid. Every replica has it (the webhook of a standby,
        which runs no operator, resolves ``gpushare.io/share`` with it)."""
        return self._requests.get(f"{namespace}/{name}")

    def skips_profiling(self, namespace: str, name: str) -> bool:
        """The GpuShare asks for no profiling (``spec.profiling.mode: skip``): its pods are
        never held back for a profiling run."""
        return f"{namespace}/{name}" in self._without_profiling


def _share_request(spec: object, *, name: str) -> GpuRequest | None:
    if not isinstance(spec, Mapping):
        return None
    try:
        parsed = parse_spec(spec)
    except InvalidInputError:
        return None
    return GpuRequest(
        percent=parsed.percent,
        memory_bytes=parsed.memory_bytes,
        gpu_class=parsed.gpu_class,
        share=name,
    )


class PodRules:
    """Pod key -> GpuShare rules, for the pods that have any, and which of them keep other
    pods off their GPU."""

    def __init__(self) -> None:
        self.by_pod: dict[str, ShareRules] = {}
        self.blockers: set[str] = set()
        """The pods whose rules keep other pods off their GPU (profiling, exclusive)."""

    def set(self, key: str, rules: ShareRules) -> bool:
        """Remember a pod's rules (NO_RULES: it has none); True when they changed."""
        if rules.share is None and not rules.constrains_gpus:
            rules = NO_RULES
        if rules == self.by_pod.get(key, NO_RULES):
            return False
        if rules == NO_RULES:
            self.by_pod.pop(key, None)
        else:
            self.by_pod[key] = rules
        if rules.blocks_others:
            self.blockers.add(key)
        else:
            self.blockers.discard(key)
        return True


def read_pod_rules(pod: Mapping[str, Any], *, granted: bool) -> ShareRules:
    """The pod's GpuShare rules; unreadable ones count as none here (the extender refuses the
    pod itself with the reason when it is scheduled)."""
    meta = metadata(pod)
    try:
        return rules_of(
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace") or "default"),
            annotations=annotations(pod),
            granted=granted,
        )
    except Exception:  # InvalidInputError, or a bound missed: never the watch's problem
        return NO_RULES
