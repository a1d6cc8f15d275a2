"""The API calls of the node agent's DRA plugin (lightkube, synchronous): read a
ResourceClaim and its Namespace's labels, and keep this node's ResourceSlices of driver
``gpu.gpushare.io``.

Objects travel as plain dicts (lightkube's generic resources), so what the plugin writes is what
the API server receives, and what the API server kept (or dropped, where the
DRAConsumableCapacity feature gate is off) is what the plugin reads back. Implements
``gpushare.node.dra.claims.ClaimSource`` and ``gpushare.node.dra.slices.SliceStore``.
"""

from collections.abc import Mapping
from typing import Any

from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Namespace, Node

from gpushare.api.dra import DRIVER
from gpushare.kube.node import _retry_transient
from gpushare.kube.resources import ResourceClaimResource, ResourceSliceResource


class DraKube:
    """One node's DRA calls, over the node agent's lightkube client."""

    def __init__(self, *, client: Client, node_name: str) -> None:
        self.client = client
        self.node_name = node_name
        self._node_uid: str | None = None

    def get_claim(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The ResourceClaim's manifest, read fresh; None when it does not exist."""

        def get() -> Mapping[str, Any] | None:
            try:
                obj = self.client.get(ResourceClaimResource, name, namespace=namespace)
            except ApiError as exc:
                if exc.status.code == 404:
                    return None
                raise
            return dict(obj)

        return _retry_transient(get, what=f"get ResourceClaim {namespace}/{name}")

    def namespace_labels(self, name: str) -> Mapping[str, str] | None:
        """The Namespace's labels (its sharing group: gpushare.packing.tenancy); None when it
        does not exist."""

        def get() -> Mapping[str, str] | None:
            try:
                obj = self.client.get(Namespace, name)
            except ApiError as exc:
                if exc.status.code == 404:
                    return None
                raise
            return dict(obj.metadata.labels or {}) if obj.metadata else {}

        return _retry_transient(get, what=f"get Namespace {name}")

    def list_slices(self) -> list[dict[str, Any]]:
        """This node's ResourceSlices of our driver."""
        return [
            dict(s)
            for s in self.client.list(
                ResourceSliceResource,
                fields={"spec.nodeName": self.node_name, "spec.driver": DRIVER},
            )
        ]

    def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        created = self.client.create(ResourceSliceResource.from_dict(dict(body)))
        return dict(created)

    def replace_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Replace (``metadata.resourceVersion`` in ``body`` guards against lost updates)."""
        replaced = self.client.replace(ResourceSliceResource.from_dict(dict(body)))
        return dict(replaced)

    def delete_slice(self, name: str) -> None:
        try:
            self.client.delete(ResourceSliceResource, name)
        except ApiError as exc:
            if exc.status.code != 404:
                raise

    def node_uid(self) -> str | None:
        """The Node's UID, for the slices' owner reference (deleted with the node)."""
        if self._node_uid is None:
            node = self.client.get(Node, self.node_name)
            self._node_uid = node.metadata.uid if node.metadata else None
        return self._node_uid
