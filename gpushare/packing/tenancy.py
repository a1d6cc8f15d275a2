"""The tenancy boundary's rule: which pods (or DRA claims) may share a GPU.

By default a GPU is shared only inside one namespace. An admin puts several namespaces in one
sharing group with the namespace label ``gpushare.io/sharing-group`` (tenants cannot label
their own Namespace), and ``cluster`` mode (the chart's ``tenancy.crossNamespaceSharing``)
turns the boundary off. The controller applies it to annotated pods
(``gpushare.cluster.state.tenancy``, ``gpushare.packing.fit``), the node agent to DRA claims
(``gpushare.node.dra.driver``). docs/security.md has the trust model.
"""

from collections.abc import Mapping
from typing import Final

from gpushare.api.names import LABEL_SHARING_GROUP

TENANCY_NAMESPACE: Final = "namespace"
TENANCY_CLUSTER: Final = "cluster"
TENANCY_MODES: Final = (TENANCY_NAMESPACE, TENANCY_CLUSTER)
_MAX_GROUP = 63


def sharing_group(labels: Mapping[str, object] | None) -> str | None:
    """The namespace's sharing group from its labels; None when it is its own."""
    group = (labels or {}).get(LABEL_SHARING_GROUP)
    return group.strip()[:_MAX_GROUP] or None if isinstance(group, str) else None


def tenancy_key(namespace: str, group: str | None, mode: str) -> str | None:
    """The tenancy a pod or claim of ``namespace`` belongs to; None without a boundary."""
    if mode == TENANCY_CLUSTER:
        return None
    return f"group:{group}" if group else namespace
