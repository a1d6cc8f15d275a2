"""Pods a GpuShare's selector matches but the share does not govern, reported on the share and
on the pod with what to do, so none is silently left without the share's GPU.

A selector links a pod only when the pod is created, in a namespace an admin enabled selectors
in (gpushare.cluster.webhook.share_match). A matching pod that is not linked was created before
the share, while the webhook could not be reached, in a namespace without that consent, or got
its label later; one linked to another share (by its own annotation, or that share's selector)
stays there. Each is reported once per share generation and controller start: the pods are
listed then, by the selector's labels (docs/operator.md, "Which pods a share governs").
"""

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpushare.api.gpushare_crd import linked_share
from gpushare.api.names import ANN_SHARE, LABEL_SHARE_SELECTORS, SHARE_SELECTORS_ENABLED
from gpushare.cluster.state.pods import FINISHED_PHASES, annotations, metadata
from gpushare.cluster.state.shares import ShareSummary
from gpushare.kube.errors import KubeError
from gpushare.kube.events import ObjectRef
from gpushare.kube.operator import KubeApi

log = logging.getLogger(__name__)

REASON_NOT_LINKED = "SelectorNotLinked"
"""A pod matches the share's selector but was created unlinked."""
REASON_NOT_ENABLED = "SelectorNotEnabled"
"""A pod matches, but selectors link no pod in its namespace (no admin consent)."""
REASON_OVERLAP = "SelectorOverlap"
"""A pod matches, but belongs to another GpuShare."""
ENABLE = f"{LABEL_SHARE_SELECTORS}={SHARE_SELECTORS_ENABLED}"
CHECKED_KEPT = 4096
"""Share generations remembered as checked before all are forgotten."""


@dataclass(frozen=True)
class Unlinked:
    """One pod the share's selector matches but the share does not govern, and why."""

    pod: str
    uid: str
    reason: str
    message: str


def unlinked_pods(
    share: ShareSummary, pods: Iterable[Mapping[str, Any]], *, enabled: bool
) -> list[Unlinked]:
    """The active pods of ``pods`` that ``share``'s selector matches and that it does not
    govern, each with the reason and what to do (pure)."""
    spec = share.spec
    if spec is None or spec.selector is None:
        return []
    out: list[Unlinked] = []
    for pod in pods:
        meta = metadata(pod)
        labels = meta.get("labels")
        status = pod.get("status")
        phase = status.get("phase") if isinstance(status, Mapping) else None
        if (
            meta.get("namespace", share.namespace) != share.namespace
            or meta.get("deletionTimestamp")
            or phase in FINISHED_PHASES
            or not isinstance(labels, Mapping)
            or not spec.selector.matches({str(k): str(v) for k, v in labels.items()})
        ):
            continue
        name, uid = str(meta.get("name", "")), str(meta.get("uid", ""))
        linked = linked_share(annotations(pod))
        if linked == share.name:
            continue
        out.append(Unlinked(name, uid, *_why(share, name, linked, enabled=enabled)))
    return sorted(out, key=lambda u: u.pod)


def _why(share: ShareSummary, pod: str, linked: str | None, *, enabled: bool) -> tuple[str, str]:
    ours = f"pod {pod} matches spec.selector of GpuShare {share.name}"
    if linked is not None:
        return REASON_OVERLAP, (
            f"{ours} but belongs to GpuShare {linked} ({ANN_SHARE}: {linked}), and stays "
            f"there: narrow spec.selector of GpuShare {share.name} to leave it out, or link "
            f"the pod's template to the share you mean"
        )
    if not enabled:
        return REASON_NOT_ENABLED, (
            f"{ours}, but selectors link pods only in namespaces an admin labelled {ENABLE}, "
            f"and {share.namespace} is not: the pod runs without the share's GPU request. Add "
            f"the annotation {ANN_SHARE}: {share.name} to its template, or ask an admin to "
            "label the namespace; then delete the pod so that it is made again"
        )
    return REASON_NOT_LINKED, (
        f"{ours} but is not linked to it (created before the share, while the gpushare "
        "webhook could not be reached, or labelled later): it runs without the share's GPU "
        "request. Delete the pod so that its controller makes it again, linked (a bare pod: "
        "create it again)"
    )


class UnlinkedReporter:
    """Lists the pods a share's selector matches once per share generation (and controller
    start), and reports each it does not govern on the share and on the pod."""

    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube
        self._checked: dict[str, tuple[str, int]] = {}
        """Share key -> (uid, generation) already checked."""

    async def check(self, share: ShareSummary) -> list[Unlinked]:
        """Report what ``share``'s selector matches but the share does not govern, once it is
        accepted; the pods reported (none when this generation was checked already)."""
        spec = share.spec
        meta = share.body.get("metadata")
        generation = meta.get("generation") if isinstance(meta, Mapping) else None
        seen = (share.uid, generation if isinstance(generation, int) else 0)
        if spec is None or spec.selector is None or self._checked.get(share.key) == seen:
            return []
        if "phase" not in share.status:
            return []  # not accepted yet
        try:
            labels = await self.kube.namespace_labels(share.namespace)
            pods = await self.kube.list_labelled_pods(
                namespace=share.namespace, labels=spec.selector.match_labels
            )
        except KubeError as exc:
            log.warning(
                "GpuShare %s: could not list the pods its selector matches: %s", share.key, exc
            )
            return []  # tried again on the next pass
        if len(self._checked) >= CHECKED_KEPT:
            self._checked.clear()  # shares long gone among them: at worst a repeated report
        self._checked[share.key] = seen
        found = unlinked_pods(
            share, pods, enabled=labels.get(LABEL_SHARE_SELECTORS) == SHARE_SELECTORS_ENABLED
        )
        for item in found:
            for about in (
                ObjectRef.share(namespace=share.namespace, name=share.name, uid=share.uid),
                ObjectRef.pod(namespace=share.namespace, name=item.pod, uid=item.uid),
            ):
                await self.kube.post_event(
                    about=about, reason=item.reason, message=item.message, warning=True
                )
        return found
