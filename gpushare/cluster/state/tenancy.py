"""Who may share a GPU, and who may keep others off one: read from namespace labels that only
cluster admins can set (tenants cannot update their own Namespace object).

- The **tenancy boundary**: by default a GPU is shared only by pods of one namespace. An admin
  puts several namespaces in one sharing group with the label ``gpushare.io/sharing-group``;
  ``--tenancy cluster`` (the chart's ``tenancy.crossNamespaceSharing``) turns the boundary off.
  The packing fit refuses a GPU holding another tenancy's pods (``gpushare.packing.fit``).
- **Neighbour rules**: a pod's ``gpushare.io/packing-policy: exclusive`` and
  ``gpushare.io/profiling: "true"`` keep other pods off its GPU; they take effect only in
  namespaces an admin labelled ``gpushare.io/neighbour-rules=granted`` (or everywhere with
  ``--neighbour-rules everyone``).
- **Share selectors**: a GpuShare's ``spec.selector`` links new pods to the share only in
  namespaces an admin labelled ``gpushare.io/share-selectors=enabled`` (docs/operator.md,
  "Which pods a share governs").

See docs/security.md for the trust model.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpushare.api.names import (
    LABEL_NEIGHBOUR_RULES,
    LABEL_SHARE_SELECTORS,
    NEIGHBOUR_RULES_GRANTED,
    SHARE_SELECTORS_ENABLED,
)
from gpushare.cluster.state.quarantine import Take, take_plainly
from gpushare.packing.tenancy import TENANCY_NAMESPACE, sharing_group, tenancy_key

RULES_GRANTED: Final = "granted-namespaces"
RULES_EVERYONE: Final = "everyone"
RULES_MODES: Final = (RULES_GRANTED, RULES_EVERYONE)


@dataclass(frozen=True)
class NamespaceGrants:
    """What the admin labels of one namespace say."""

    group: str | None = None
    """Sharing group (label ``gpushare.io/sharing-group``); None: the namespace is its own."""
    neighbour_rules: bool = False
    """Label ``gpushare.io/neighbour-rules=granted``."""
    share_selectors: bool = False
    """Label ``gpushare.io/share-selectors=enabled``: GpuShare selectors link new pods."""


def grants_of(namespace: Mapping[str, Any]) -> tuple[str, NamespaceGrants] | None:
    """(name, grants) of a watched Namespace object; None when it has no name."""
    meta = namespace.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return None
    labels = meta.get("labels")
    labels = labels if isinstance(labels, Mapping) else {}
    return meta["name"], NamespaceGrants(
        group=sharing_group(labels),
        neighbour_rules=labels.get(LABEL_NEIGHBOUR_RULES) == NEIGHBOUR_RULES_GRANTED,
        share_selectors=labels.get(LABEL_SHARE_SELECTORS) == SHARE_SELECTORS_ENABLED,
    )


class Tenancies:
    """Namespace grants by name, and the tenancy and rule grant they give a pod."""

    def __init__(self, *, mode: str = TENANCY_NAMESPACE, rules: str = RULES_GRANTED) -> None:
        self.mode = mode
        self.rules = rules
        self._grants: dict[str, NamespaceGrants] = {}
        self.synced = False
        self.version = 0
        """Moves whenever a namespace's grants change (the admission process's kept lookup
        answers are forgotten then: gpushare.cluster.admission.host)."""

    def tenancy(self, namespace: str) -> str | None:
        """The tenancy a pod of ``namespace`` belongs to; None without a boundary."""
        grants = self._grants.get(namespace)
        return tenancy_key(namespace, grants.group if grants else None, self.mode)

    def neighbour_rules(self, namespace: str) -> bool:
        """May pods of ``namespace`` keep other pods off their GPU?"""
        if self.rules == RULES_EVERYONE:
            return True
        grants = self._grants.get(namespace)
        return grants is not None and grants.neighbour_rules

    def share_selectors(self, namespace: str) -> bool:
        """Do GpuShare selectors link new pods of ``namespace`` (an admin labelled it)?"""
        grants = self._grants.get(namespace)
        return grants is not None and grants.share_selectors

    def upsert(self, namespace: Mapping[str, Any]) -> str | None:
        """Take a watched Namespace in; returns its name when its grants changed."""
        found = grants_of(namespace)
        if found is None:
            return None
        name, grants = found
        if self._grants.get(name, NamespaceGrants()) == grants:
            self._grants.setdefault(name, grants)
            return None
        self._grants[name] = grants
        self.version += 1
        return name

    def delete(self, name: str) -> bool:
        gone = self._grants.pop(name, None) is not None
        if gone:
            self.version += 1
        return gone

    def replace(
        self, namespaces: Iterable[Mapping[str, Any]], *, take: Take = take_plainly
    ) -> set[str]:
        """A full list; returns the names whose grants changed. ``take`` takes each one in
        (the view's quarantine: a namespace it holds out keeps its earlier grants)."""
        before = dict(self._grants)
        grants: dict[str, NamespaceGrants] = {}

        def take_in(namespace: Mapping[str, Any]) -> None:
            found = grants_of(namespace)
            if found is not None:
                grants[found[0]] = found[1]

        for namespace in namespaces:
            if not take("Namespace", namespace, take_in):
                meta = namespace.get("metadata")
                name = meta.get("name") if isinstance(meta, Mapping) else None
                if isinstance(name, str) and name in before:
                    grants[name] = before[name]
        self._grants = grants
        self.synced = True
        names = set(before) | set(self._grants)
        changed = {n for n in names if before.get(n) != self._grants.get(n)}
        if changed:
            self.version += 1
        return changed
