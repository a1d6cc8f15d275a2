"""Which GpuShare a new pod's labels link it to (a share's ``spec.selector``), decided once, at
admission, and written on the pod as ``gpushare.io/share``: from then on the pod is reviewed,
placed and governed exactly as a pod that named the share itself (one code path, the
annotation's).

Tenancy (docs/operator.md, "Which pods a share governs"): a label is not consent.

- Only GpuShares of the pod's own namespace are considered.
- Selectors link pods only in namespaces an admin labelled ``gpushare.io/share-selectors=
  enabled``; elsewhere a matching gpushare pod is admitted unlinked with a warning saying so.
- A pod that names its share (``gpushare.io/share``) keeps it, whatever its labels match.
- A pod matching the selectors of two shares is refused, naming both.
- Only a new pod is linked: a label added to a running pod links nothing (admission sees
  creations only, and the operator governs by the annotation alone), so it never moves the pod
  or changes its limits.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_SHARE, LABEL_SHARE_SELECTORS, SHARE_SELECTORS_ENABLED
from gpushare.cluster.state import pods
from gpushare.cluster.webhook.facts import ClusterFacts
from gpushare.cluster.webhook.patch import annotation_ops

ENABLE_SELECTORS = f"{LABEL_SHARE_SELECTORS}={SHARE_SELECTORS_ENABLED}"


@dataclass(frozen=True)
class SelectorLink:
    """What the selectors of the namespace's GpuShares make of a new pod."""

    pod: pods.Pod | None = None
    """The pod as it is reviewed: with ``gpushare.io/share`` naming the share it is linked to;
    None when no selector links it."""
    ops: tuple[dict[str, Any], ...] = ()
    """The JSON patch operations that write that link on the pod as created."""
    errors: tuple[InvalidInputError, ...] = ()
    warnings: tuple[str, ...] = ()


NO_LINK = SelectorLink()


def matching_shares(pod: pods.Pod, *, namespace: str, facts: ClusterFacts) -> list[str]:
    """Names of the GpuShares of ``namespace`` whose selector matches the pod's labels."""
    if facts.selector_lookup is None:
        return []
    labels = pods.metadata(pod).get("labels")
    if not isinstance(labels, Mapping) or not labels:
        return []
    text = {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}
    return [name for name, selector in facts.selector_lookup(namespace) if selector.matches(text)]


def selector_link(pod: pods.Pod, *, namespace: str, facts: ClusterFacts) -> SelectorLink:
    """The link a new pod gets from the selectors of its namespace's GpuShares."""
    if pods.annotations(pod).get(ANN_SHARE, "").strip():
        return NO_LINK  # it named its share: the annotation wins
    names = matching_shares(pod, namespace=namespace, facts=facts)
    if not names:
        return NO_LINK
    shown = " and ".join(f"GpuShare {n}" for n in names[:2])
    if facts.selectors_enabled is None or not facts.selectors_enabled(namespace):
        return SelectorLink(
            warnings=(
                f"gpushare: the pod's labels match spec.selector of {shown}, but selectors link "
                f"pods only in namespaces an admin labelled {ENABLE_SELECTORS}; {namespace} is "
                f"not, so the pod is not linked: add the annotation {ANN_SHARE}: {names[0]}, or "
                "ask an admin to label the namespace",
            )
        )
    if len(names) > 1:
        return SelectorLink(
            errors=(
                InvalidInputError(
                    "metadata.labels",
                    f"match spec.selector of {shown}; a pod belongs to one GpuShare",
                    f"name one with the annotation {ANN_SHARE}: {names[0]}, or narrow one "
                    "share's spec.selector",
                ),
            )
        )
    name = names[0]
    ops = annotation_ops(pod, {ANN_SHARE: name}, after=[])
    return SelectorLink(pod=_linked(pod, name), ops=tuple(ops))


def _linked(pod: pods.Pod, share: str) -> pods.Pod:
    """A copy of the pod naming ``share`` (its other parts shared, never changed)."""
    meta = dict(pods.metadata(pod))
    meta["annotations"] = {**pods.annotations(pod), ANN_SHARE: share}
    return {**pod, "metadata": meta}
