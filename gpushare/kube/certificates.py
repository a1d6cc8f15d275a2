"""The controller's certificate Secrets and the Deployment it restarts when they change
(gpushare.cluster.certificates decides; this module only reads and writes).

Secrets are read and written whole, with their resourceVersion, so two replicas racing to
create or renew one never both win."""

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from lightkube import AsyncClient
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Secret
from lightkube.types import PatchType

from gpushare.kube.errors import ConflictError, NotFoundError, translated


@dataclass(frozen=True)
class StoredSecret:
    """A Secret as the certificate keeper sees it: decoded data, annotations, version."""

    name: str
    data: Mapping[str, bytes]
    annotations: Mapping[str, str] = field(default_factory=dict)
    resource_version: str = ""


@dataclass(frozen=True)
class Owner:
    """The object whose deletion takes the Secrets with it (garbage collection)."""

    api_version: str
    kind: str
    name: str
    uid: str


class SecretStore:
    """Secrets of one namespace, and the pod-template annotation of its Deployments."""

    def __init__(self, client: AsyncClient, *, namespace: str, field_manager: str) -> None:
        self._client = client
        self.namespace = namespace
        self._field_manager = field_manager

    async def get(self, name: str) -> StoredSecret | None:
        """The Secret ``name``; None when there is none."""
        try:
            with translated(f"get Secret {self.namespace}/{name}"):
                obj = await self._client.get(Secret, name, namespace=self.namespace)
        except NotFoundError:
            return None
        meta = obj.metadata
        return StoredSecret(
            name=name,
            data={k: base64.b64decode(v) for k, v in (obj.data or {}).items()},
            annotations=dict((meta.annotations if meta else None) or {}),
            resource_version=str((meta.resourceVersion if meta else None) or ""),
        )

    def _body(
        self,
        name: str,
        data: Mapping[str, bytes],
        *,
        labels: Mapping[str, str],
        owner: Owner | None,
        resource_version: str = "",
    ) -> Secret:
        meta: dict[str, Any] = {"name": name, "namespace": self.namespace, "labels": dict(labels)}
        if resource_version:
            meta["resourceVersion"] = resource_version
        if owner is not None:
            meta["ownerReferences"] = [
                {
                    "apiVersion": owner.api_version,
                    "kind": owner.kind,
                    "name": owner.name,
                    "uid": owner.uid,
                }
            ]
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta,
            "type": "kubernetes.io/tls",
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        return cast(Secret, Secret.from_dict(body))

    async def create(
        self,
        name: str,
        data: Mapping[str, bytes],
        *,
        labels: Mapping[str, str],
        owner: Owner | None,
    ) -> bool:
        """Create the Secret; False when one of that name exists already."""
        try:
            with translated(f"create Secret {self.namespace}/{name}"):
                await self._client.create(
                    self._body(name, data, labels=labels, owner=owner),
                    field_manager=self._field_manager,
                )
        except ConflictError:
            return False
        return True

    async def replace(
        self,
        old: StoredSecret,
        data: Mapping[str, bytes],
        *,
        labels: Mapping[str, str],
        owner: Owner | None,
    ) -> bool:
        """Replace ``old`` (its annotations dropped); False when it changed since it was read."""
        body = self._body(
            old.name, data, labels=labels, owner=owner, resource_version=old.resource_version
        )
        try:
            with translated(f"replace Secret {self.namespace}/{old.name}"):
                await self._client.replace(body, field_manager=self._field_manager)
        except (ConflictError, NotFoundError):
            return False
        return True

    async def deployment(self, name: str) -> tuple[Owner, dict[str, str]] | None:
        """Deployment ``name`` as an owner, and its own annotations; None if none."""
        try:
            with translated(f"get Deployment {self.namespace}/{name}"):
                obj = await self._client.get(Deployment, name, namespace=self.namespace)
        except NotFoundError:
            return None
        annotations = dict((obj.metadata.annotations if obj.metadata else None) or {})
        uid = str((obj.metadata.uid if obj.metadata else None) or "")
        return Owner("apps/v1", "Deployment", name, uid), annotations

    async def annotate_deployment(
        self,
        name: str,
        annotations: Mapping[str, str],
        *,
        pod_template: Mapping[str, str] | None = None,
    ) -> None:
        """Merge ``annotations`` into Deployment ``name``'s, and ``pod_template`` into its pod
        template's (a rolling restart, as ``kubectl rollout restart`` does)."""
        patch: dict[str, Any] = {"metadata": {"annotations": dict(annotations)}}
        if pod_template:
            patch["spec"] = {"template": {"metadata": {"annotations": dict(pod_template)}}}
        with translated(f"restart Deployment {self.namespace}/{name}"):
            await self._client.patch(
                Deployment,
                name,
                patch,
                namespace=self.namespace,
                patch_type=PatchType.MERGE,
                field_manager=self._field_manager,
            )
