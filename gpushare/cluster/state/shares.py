"""GpuShares as the view knows them: each share as watched, its spec read once
(:class:`ShareSummary`, kept by :class:`ShareRegistry`), and the rules its pods carry in their
annotations (:class:`PodRules`, read by ``share_rules``)."""

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.gpushare_crd import PROFILING_SKIP, GpuShareSpec, parse_spec
from gpushare.api.label_selector import LabelSelector
from gpushare.api.profile import GpuProfile
from gpushare.api.request import GpuRequest
from gpushare.cluster.state.pods import annotations, metadata
from gpushare.cluster.state.quarantine import Take, take_plainly
from gpushare.cluster.state.share_rules import NO_RULES, ShareRules, rules_of
from gpushare.packing.model import PipeProfile
from gpushare.packing.sizing import as_fraction, suggested_percent
from gpushare.packing.stored_profile import pipe_profile


@dataclass(frozen=True)
class ShareSummary:
    """One GpuShare as last watched: its object, and its spec read once."""

    namespace: str
    name: str
    uid: str
    body: Mapping[str, Any]
    """The latest raw object (spec, status, metadata) as watched."""
    spec: GpuShareSpec | None
    spec_error: str | None = None
    """Why the spec is invalid, when it is."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def status(self) -> Mapping[str, Any]:
        status = self.body.get("status")
        return status if isinstance(status, Mapping) else {}

    @property
    def sized_fraction(self) -> str | None:
        """What ``fraction: auto`` comes to now (written as ``status.request``, e.g. "0.6");
        None for a share that states its fraction or has no valid spec."""
        if self.spec is None or not self.spec.auto:
            return None
        return as_fraction(sized_percent(self.spec, self.status))

    @property
    def request(self) -> GpuRequest | None:
        """The request the share stands for (:func:`sized_percent`); None when its spec is
        invalid."""
        if self.spec is None:
            return None
        return GpuRequest(
            percent=sized_percent(self.spec, self.status),
            memory_bytes=self.spec.memory_bytes,
            gpu_class=self.spec.gpu_class,
            share=self.name,
            opportunistic=self.spec.opportunistic,
            sized=self.spec.auto,
        )


def stored_pipe_profile(status: Mapping[str, Any]) -> PipeProfile | None:
    """The share's ``status.profile`` as the policy reads it; None when absent or unreadable
    (a damaged status costs the share its sizing, never the watch)."""
    raw = status.get("profile")
    if not isinstance(raw, Mapping):
        return None
    try:
        return pipe_profile(GpuProfile.from_status(raw))
    except InvalidInputError:
        return None


def sized_percent(spec: GpuShareSpec, status: Mapping[str, Any]) -> int:
    """The share's request in GPU-percent: ``spec.fraction``, or with ``fraction: auto`` what
    ``gpushare.packing.sizing.suggested_percent`` gives its stored profile (a batch share
    without one: the whole GPU, so its first pod is profiled alone)."""
    if not spec.auto:
        return spec.percent
    return suggested_percent(stored_pipe_profile(status), gpu_class=spec.gpu_class)


def share_summary(body: Mapping[str, Any]) -> ShareSummary:
    meta = body.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    raw_spec = body.get("spec")
    spec: GpuShareSpec | None = None
    error: str | None = None
    try:
        spec = parse_spec(raw_spec if isinstance(raw_spec, Mapping) else {})
    except InvalidInputError as exc:
        error = str(exc)
    return ShareSummary(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        body=body,
        spec=spec,
        spec_error=error,
    )


class ShareRegistry:
    """Every watched GpuShare (:class:`ShareSummary`), its status, the request it stands for,
    and whether it skips profiling, by ``namespace/name``."""

    def __init__(self) -> None:
        self.by_key: dict[str, ShareSummary] = {}
        self.statuses: dict[str, Mapping[str, Any]] = {}
        self._without_profiling: set[str] = set()
        self.version = 0
        """Bumped when a share comes, goes or its spec changes (not its status): what
        governs which pod is cached by it (gpushare.cluster.state.governance)."""

    def upsert(self, share: Mapping[str, Any]) -> ShareSummary | None:
        """Take a watched GpuShare in; None (nothing kept) for an object without a name."""
        meta = share.get("metadata")
        if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
            return None
        summary = share_summary(share)
        key = summary.key
        before = self.by_key.get(key)
        if before is None or before.spec != summary.spec:
            self.version += 1
        self.by_key[key] = summary
        status = share.get("status")
        self.statuses[key] = dict(status) if isinstance(status, Mapping) else {}
        spec = share.get("spec")
        profiling = spec.get("profiling") if isinstance(spec, Mapping) else None
        mode = profiling.get("mode") if isinstance(profiling, Mapping) else None
        if mode == PROFILING_SKIP:
            self._without_profiling.add(key)
        else:
            self._without_profiling.discard(key)
        return summary

    def delete(self, share: Mapping[str, Any]) -> None:
        meta = share.get("metadata")
        if isinstance(meta, Mapping):
            key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
            self.version += 1
            self.by_key.pop(key, None)
            self.statuses.pop(key, None)
            self._without_profiling.discard(key)

    def replace(self, shares: Iterable[Mapping[str, Any]], *, take: Take = take_plainly) -> None:
        """A full list: shares missing from it are gone. ``take`` takes each one in (the view's
        quarantine: a share it holds out keeps what was known of it)."""
        seen: set[str] = set()
        for share in shares:
            meta = share.get("metadata")
            if isinstance(meta, Mapping):
                seen.add(f"{meta.get('namespace') or 'default'}/{meta.get('name')}")
            take("GpuShare", share, self.upsert)
        for key in [k for k in self.by_key if k not in seen]:
            self.version += 1
            self.by_key.pop(key, None)
            self.statuses.pop(key, None)
            self._without_profiling.discard(key)

    def request(self, namespace: str, name: str) -> GpuRequest | None:
        """The request a GpuShare stands for, from its spec as watched; None when there is no
        such share or its spec is invalid. Every replica has it (the webhook of a standby,
        which runs no operator, resolves ``gpushare.io/share`` with it)."""
        share = self.by_key.get(f"{namespace}/{name}")
        return share.request if share is not None else None

    def skips_profiling(self, namespace: str, name: str) -> bool:
        """The GpuShare asks for no profiling (``spec.profiling.mode: skip``): its pods are
        never held back for a profiling run."""
        return f"{namespace}/{name}" in self._without_profiling

    def in_namespace(self, namespace: str) -> Iterator[ShareSummary]:
        return (s for s in self.by_key.values() if s.namespace == namespace)

    def selectors(self, namespace: str) -> list[tuple[str, LabelSelector]]:
        """(name, spec.selector) of the valid GpuShares of ``namespace`` that have a selector,
        by name: what the webhook links a new pod by (gpushare.cluster.webhook.share_match)."""
        return sorted(
            (s.name, s.spec.selector)
            for s in self.in_namespace(namespace)
            if s.spec is not None and s.spec.selector is not None
        )


class PodRules:
    """Pod key -> GpuShare rules, for the pods that have any, and which of them keep other
    pods off their GPU (in DRA mode, claim key -> the rules of the pod using the claim:
    gpushare.cluster.dra.devices)."""

    def __init__(self) -> None:
        self.by_pod: dict[str, ShareRules] = {}
        self.blockers: set[str] = set()
        """The pods whose rules keep other pods off their GPU (profiling, exclusive)."""

    def set(self, key: str, rules: ShareRules) -> bool:
        """Remember a pod's rules (NO_RULES: it has none); True when they changed."""
        if rules.share is None and not rules.constrains_gpus:
            rules = NO_RULES
        return self.put(key, rules)

    def put(self, key: str, rules: ShareRules) -> bool:
        """Remember ``rules`` as they are (NO_RULES: none); True when they changed."""
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
