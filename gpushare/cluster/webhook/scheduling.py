"""Tolerations and a runtime class the webhook adds to gpushare pods (issue #46, item 6).

A gpushare pod asks for ``gpushare.io/gpu-percent``, not ``nvidia.com/gpu``, so what a cloud
adds to GPU pods does not reach it: GKE taints GPU nodes ``nvidia.com/gpu=present:NoSchedule``
and tolerates it only for pods asking ``nvidia.com/gpu``, and the GPU Operator's containers
may need the ``nvidia`` RuntimeClass. The controller's ``--pod-toleration`` (default: that
taint) and ``--pod-runtime-class`` name what to add; a pod keeps anything it says itself
(docs/scheduling.md, "Admission webhook").
"""

from collections.abc import Mapping, Sequence
from typing import Any

from gpushare.cluster.state import pods


def _tolerated(existing: Sequence[Any], wanted: Mapping[str, str]) -> bool:
    """Whether the pod already tolerates the taint ``wanted`` is for (same key and effect, or
    a toleration of every key or effect)."""
    for item in existing:
        if not isinstance(item, Mapping):
            continue
        key, effect = item.get("key"), item.get("effect")
        if item.get("operator") == "Exists" and not key:
            return True
        if key == wanted["key"] and effect in (None, "", wanted["effect"]):
            return True
    return False


def scheduling_ops(
    pod: pods.Pod, *, tolerations: Sequence[Mapping[str, str]], runtime_class: str
) -> list[dict[str, Any]]:
    """JSON patch operations adding ``tolerations`` the pod lacks and ``runtime_class`` when
    the pod names none."""
    spec = pods.spec(pod)
    ops: list[dict[str, Any]] = []
    current = spec.get("tolerations")
    existing = list(current) if isinstance(current, list) else []
    missing = [dict(t) for t in tolerations if not _tolerated(existing, t)]
    if missing:
        if not isinstance(current, list):
            ops.append({"op": "add", "path": "/spec/tolerations", "value": missing})
        else:
            ops += [{"op": "add", "path": "/spec/tolerations/-", "value": t} for t in missing]
    if runtime_class and not spec.get("runtimeClassName"):
        ops.append({"op": "add", "path": "/spec/runtimeClassName", "value": runtime_class})
    return ops
