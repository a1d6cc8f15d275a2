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

from lightkube import Client
from lightkube.resources.core_v1 import Namespace, Node

from gpushare.api.dra import DRIVER
from gpushare.kube.errors import NotFoundError, translated
from gpushare.kube.resources import ResourceClaimResource, ResourceSliceResource
from gpushare.kube.retry import retry_transient


class DraKube:
    """One node's DRA calls, over the node agent's lightkube client."""

    def __init__(self, *, client: Client, node_name: str) -> None:
        self.client = client
        self.node_name = node_name
        self._node_uid: str | None = None

    def get_claim(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The ResourceClaim's manifest, read fresh; None when it does not exist."""
        what = f"get ResourceClaim {namespace}/{name}"
        try:
            with translated(what):
                obj = retry_transient(
                    lambda: self.client.get(ResourceClaimResource, name, namespace=namespace),
                    what=what,
                )
        except NotFoundError:
            return None
        return dict(obj)

    def namespace_labels(self, name: str) -> Mapping[str, str] | None:
        """The Namespace's labels (its sharing group: gpushare.packing.tenancy); None when it
        does not exist."""
        what = f"get Namespace {name}"
        try:
            with translated(what):
                obj = retry_transient(lambda: self.client.get(Namespace, name), what=what)
        except NotFoundError:
            return None
        return dict(obj.metadata.labels or {}) if obj.metadata else {}

    def list_slices(self) -> list[dict[str, Any]]:
        """This node's ResourceSlices of our driver."""
        with translated("list this node's ResourceSlices"):
            return [
                dict(s)
                for s in self.client.list(
                    ResourceSliceResource,
                    fields={"spec.nodeName": self.node_name, "spec.driver": DRIVER},
                )
            ]

    def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        with translated("create ResourceSlice"):
            created = self.client.create(ResourceSliceResource.from_dict(dict(body)))
        return dict(created)

    def replace_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Replace (``metadata.resourceVersion`` in ``body`` guards against lost updates)."""
        with translated("replace ResourceSlice"):
            replaced = self.client.replace(ResourceSliceResource.from_dict(dict(body)))
        return dict(replaced)

    def delete_slice(self, name: str) -> None:
        """Delete a ResourceSlice; one already gone is fine."""
        try:
            with translated(f"delete ResourceSlice {name}"):
                self.client.delete(ResourceSliceResource, name)
        except NotFoundError:
            pass

    def node_uid(self) -> str | None:
        """The Node's UID, for the slices' owner reference (deleted with the node)."""
        if self._node_uid is None:
            with translated(f"get node {self.node_name}"):
                node = self.client.get(Node, self.node_name)
            self._node_uid = node.metadata.uid if node.metadata else None
        return self._node_uid
