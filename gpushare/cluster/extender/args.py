"""kube-scheduler's extender JSON (k8s.io/kube-scheduler/extender/v1), read strictly.

Its structs carry no JSON tags: keys are the Go field names (``Pod``, ``NodeNames``,
``FailedNodes``, ``FailedAndUnresolvableNodes``, ``Host``, ``Score``, ``PodName``, ``Node``,
``Error``). With ``nodeCacheCapable`` the scheduler sends only node names; full ``Nodes`` lists
are accepted too. A body that is not what the verb expects is refused (HTTP 400).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class BadRequestError(ValueError):
    """A body that is not the extender JSON the verb expects (answered with HTTP 400)."""


@dataclass(frozen=True)
class ExtenderArgs:
    pod: Mapping[str, Any]
    node_names: list[str]
    nodes: list[Mapping[str, Any]] | None
    """The full NodeList items when the scheduler is not nodeCacheCapable, else None."""


@dataclass(frozen=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


MAX_NODES = 20_000
"""Most nodes one call may name (Kubernetes supports 5,000 per cluster): a longer list (issue
67: 45 MiB of names from the holder of the scheduler's client certificate) is refused before
any of it is filtered."""


def _str_list(value: object, where: str) -> list[str]:
    """The names, each once, in order: a node named twice gets one answer (kube-scheduler never
    sends one twice; a forged call that does must not get it passed twice or both passed and
    failed). set(map(type, ...)) and dict.fromkeys run in C: hundreds of names per call."""
    if isinstance(value, list) and len(value) > MAX_NODES:
        raise BadRequestError(f"{where} names {len(value)} nodes (at most {MAX_NODES})")
    if not isinstance(value, list) or not set(map(type, value)) <= {str}:
        raise BadRequestError(f"{where} must be a list of strings")
    return list(dict.fromkeys(value))


def parse_extender_args(doc: object) -> ExtenderArgs:
    """Validate an ExtenderArgs document; raises BadRequestError naming the bad key."""
    if not isinstance(doc, dict):
        raise BadRequestError("body must be an ExtenderArgs object with keys Pod and NodeNames")
    pod = doc.get("Pod")
    if not isinstance(pod, dict):
        raise BadRequestError("Pod must be an object (the v1.Pod being scheduled)")
    meta = pod.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise BadRequestError("Pod.metadata.name must be a string")
    for part in ("metadata", "spec", "status"):
        if part in pod and pod[part] is not None and not isinstance(pod[part], dict):
            raise BadRequestError(f"Pod.{part} must be an object")
    if meta.get("annotations") is not None and not isinstance(meta.get("annotations"), dict):
        raise BadRequestError("Pod.metadata.annotations must be an object")
    names = doc.get("NodeNames")
    nodes_doc = doc.get("Nodes")
    if names is not None:
        return ExtenderArgs(pod=pod, node_names=_str_list(names, "NodeNames"), nodes=None)
    if nodes_doc is not None:
        items = nodes_doc.get("items") if isinstance(nodes_doc, dict) else None
        if not isinstance(items, list):
            raise BadRequestError("Nodes must be a v1.NodeList object with items")
        if len(items) > MAX_NODES:
            raise BadRequestError(f"Nodes holds {len(items)} nodes (at most {MAX_NODES})")
        kept: dict[str, Mapping[str, Any]] = {}
        for i, node in enumerate(items):
            node_meta = node.get("metadata") if isinstance(node, dict) else None
            name = node_meta.get("name") if isinstance(node_meta, dict) else None
            if not isinstance(name, str):
                raise BadRequestError(f"Nodes.items[{i}].metadata.name must be a string")
            kept.setdefault(name, node)  # a node listed twice is answered once
        return ExtenderArgs(pod=pod, node_names=list(kept), nodes=list(kept.values()))
    raise BadRequestError("one of NodeNames or Nodes is required")


def parse_binding_args(doc: object) -> BindingArgs:
    if not isinstance(doc, dict):
        raise BadRequestError("body must be an ExtenderBindingArgs object")
    values: dict[str, str] = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = doc.get(key)
        if not isinstance(value, str) or (key != "PodUID" and not value):
            raise BadRequestError(f"{key} must be a non-empty string")
        values[key] = value
    return BindingArgs(values["PodName"], values["PodNamespace"], values["PodUID"], values["Node"])


@dataclass(frozen=True)
class PreemptionArgs:
    """``ExtenderPreemptionArgs``: the pod kube-scheduler would preempt for and, per candidate
    node, the UIDs of the pods it chose to evict there with its PDB violation count."""

    pod: Mapping[str, Any]
    victims: dict[str, tuple[list[str], int]]
    """Node -> (victim pod UIDs, NumPDBViolations)."""


def _victims(value: object, where: str, *, meta: bool) -> dict[str, tuple[list[str], int]]:
    """``NodeNameToMetaVictims`` (``{"Pods": [{"UID": ...}]}``) or ``NodeNameToVictims``
    (``{"Pods": [v1.Pod]}``, whose UIDs are read)."""
    if not isinstance(value, dict):
        raise BadRequestError(f"{where} must be an object of node name -> victims")
    if len(value) > MAX_NODES:
        raise BadRequestError(f"{where} names {len(value)} nodes (at most {MAX_NODES})")
    out: dict[str, tuple[list[str], int]] = {}
    for node, victims in value.items():
        pods = victims.get("Pods") if isinstance(victims, dict) else None
        if not isinstance(pods, list):
            raise BadRequestError(f"{where}[{node!r}].Pods must be a list")
        violations = victims.get("NumPDBViolations", 0) if isinstance(victims, dict) else 0
        if not isinstance(violations, int) or isinstance(violations, bool) or violations < 0:
            raise BadRequestError(f"{where}[{node!r}].NumPDBViolations must be a count")
        uids: list[str] = []
        for i, pod in enumerate(pods):
            uid = None
            if isinstance(pod, dict):
                if meta:
                    uid = pod.get("UID")
                else:
                    metadata = pod.get("metadata")
                    uid = metadata.get("uid") if isinstance(metadata, dict) else None
            if not isinstance(uid, str) or not uid:
                field = "UID" if meta else "metadata.uid"
                raise BadRequestError(f"{where}[{node!r}].Pods[{i}].{field} must be a string")
            uids.append(uid)
        out[str(node)] = (uids, violations)
    return out


def parse_preemption_args(doc: object) -> PreemptionArgs:
    """Validate an ExtenderPreemptionArgs document; raises BadRequestError naming the bad key.
    kube-scheduler sends ``NodeNameToMetaVictims`` to a node-cache-capable extender, else
    ``NodeNameToVictims``."""
    if not isinstance(doc, dict):
        raise BadRequestError(
            "body must be an ExtenderPreemptionArgs object with keys Pod and NodeNameToMetaVictims"
        )
    pod = parse_extender_args({"Pod": doc.get("Pod"), "NodeNames": []}).pod
    meta = doc.get("NodeNameToMetaVictims")
    if meta is not None:
        return PreemptionArgs(pod, _victims(meta, "NodeNameToMetaVictims", meta=True))
    full = doc.get("NodeNameToVictims")
    if full is not None:
        return PreemptionArgs(pod, _victims(full, "NodeNameToVictims", meta=False))
    raise BadRequestError("one of NodeNameToMetaVictims or NodeNameToVictims is required")
