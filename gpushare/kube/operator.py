"""The API calls the GpuShare operator makes (besides Kopf's own watches and patches).

Every write here is either idempotent (merge patches of annotations and cache entries) or
guarded by a JSON-patch ``test`` of the share's phase, so a retried or repeated step never
applies twice.
"""

import enum
import logging
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import DeleteOptions, ObjectMeta, Preconditions
from lightkube.resources.core_v1 import ConfigMap, Node, Pod
from lightkube.types import PatchType

from gpushare.api.names import GROUP
from gpushare.kube.config import load_config
from gpushare.kube.events import ObjectRef, Reporter
from gpushare.kube.resources import GpuShareResource

log = logging.getLogger(__name__)

COMPONENT = "gpushare-operator"
FIELD_MANAGER = "gpushare-operator"


class EvictionOutcome(enum.Enum):
    EVICTED = "evicted"
    BLOCKED = "blocked"
    """429: a PodDisruptionBudget forbids it now; try again later."""
    GONE = "gone"


class KubeApi:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self._instance = socket.gethostname()

    @classmethod
    def from_environment(cls) -> "KubeApi":
        """:func:`~gpushare.kube.config.load_config`'s API server ($KUBECONFIG first, as Kopf
        reads it)."""
        return cls(AsyncClient(config=load_config(), field_manager=FIELD_MANAGER))

    async def close(self) -> None:
        await self._client.close()

    async def list_pods(self, *, namespace: str | None) -> list[dict[str, Any]]:
        """Every pod of ``namespace`` (None: all namespaces), as API JSON."""
        found = self._client.list(Pod, namespace=namespace or "*", chunk_size=500)
        return [dict(pod.to_dict()) async for pod in found]

    async def list_nodes(self) -> list[dict[str, Any]]:
        return [dict(node.to_dict()) async for node in self._client.list(Node, chunk_size=500)]

    async def get_share(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj = await self._client.get(GpuShareResource, name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise
        # lightkube's generic resources leave to_dict untyped.
        return dict(obj.to_dict())  # type: ignore[no-untyped-call]

    async def patch_share_status(
        self,
        *,
        namespace: str,
        name: str,
        ops: Sequence[Mapping[str, Any]],
    ) -> bool:
        """Apply a JSON patch to the share's status. False (nothing changed) when a ``test``
        op failed, i.e. someone already took this step, or the share is gone."""
        try:
            await self._client.patch(
                GpuShareResource.Status,
                name,
                [dict(op) for op in ops],
                namespace=namespace,
                patch_type=PatchType.JSON,
            )
        except ApiError as exc:
            if exc.status.code == 404:
                return False
            # A failed "test" op is a 422 without causes; a schema violation lists its causes.
            details = exc.status.details
            if exc.status.code == 422 and not (details and details.causes):
                log.info("share %s/%s: status changed meanwhile; step not taken", namespace, name)
                return False
            raise
        return True

    async def merge_share_status(
        self, *, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        """Merge-patch fields of the share's status that are pure functions of the cluster
        (placements, pod count): writing them twice is harmless."""
        try:
            await self._client.patch(
                GpuShareResource.Status,
                name,
                {"status": dict(status)},
                namespace=namespace,
                patch_type=PatchType.MERGE,
            )
        except ApiError as exc:
            if exc.status.code != 404:
                raise

    async def annotate_pod(
        self, *, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> bool:
        """Merge annotations into a pod (None removes one). False when the pod is gone."""
        try:
            await self._client.patch(
                Pod,
                name,
                {"metadata": {"annotations": dict(annotations)}},
                namespace=namespace,
                patch_type=PatchType.MERGE,
            )
        except ApiError as exc:
            if exc.status.code == 404:
                return False
            raise
        return True

    async def evict(self, *, namespace: str, name: str, uid: str | None = None) -> EvictionOutcome:
        """Evict through the Eviction API, so PodDisruptionBudgets are respected. With
        ``uid``, only that pod: one recreated under the same name meanwhile is not evicted
        (the API server answers 409, taken as gone)."""
        body = Pod.Eviction(
            metadata=ObjectMeta(name=name, namespace=namespace),
            deleteOptions=DeleteOptions(preconditions=Preconditions(uid=uid)) if uid else None,
        )
        try:
            await self._client.create(body, name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 429:
                return EvictionOutcome.BLOCKED
            if exc.status.code in (404, 409):
                return EvictionOutcome.GONE
            raise
        return EvictionOutcome.EVICTED

    async def post_event(
        self, *, about: ObjectRef, reason: str, message: str, warning: bool = False
    ) -> None:
        """A core/v1 Event on ``about`` (shown by kubectl describe). Failures are logged, not
        raised: an Event is a report, never a reason to repeat the step it reports."""
        reporter = Reporter(COMPONENT, f"{GROUP}/operator", instance=self._instance)
        body = reporter.event(about, reason=reason, message=message, warning=warning)
        try:
            await self._client.create(body)
        except ApiError as exc:
            log.warning("could not post event %s on %s/%s: %s", reason, about.kind, about.name, exc)

    async def read_configmap(self, *, namespace: str, name: str) -> dict[str, str]:
        try:
            cm = await self._client.get(ConfigMap, name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return {}
            raise
        return dict(cm.data or {})

    async def put_configmap_entries(
        self, *, namespace: str, name: str, entries: Mapping[str, str | None]
    ) -> None:
        """Set (or, with None, delete) keys of a ConfigMap, creating it when absent."""
        try:
            await self._client.patch(
                ConfigMap,
                name,
                {"data": dict(entries)},
                namespace=namespace,
                patch_type=PatchType.MERGE,
            )
            return
        except ApiError as exc:
            if exc.status.code != 404:
                raise
        data = {k: v for k, v in entries.items() if v is not None}
        cm = ConfigMap(
            metadata=ObjectMeta(
                name=name,
                namespace=namespace,
                labels={
                    "app.kubernetes.io/name": "gpushare",
                    "app.kubernetes.io/component": "operator",
                },
            ),
            data=data,
        )
        try:
            await self._client.create(cm)
        except ApiError as exc:
            if exc.status.code != 409:
                raise
            await self.put_configmap_entries(namespace=namespace, name=name, entries=entries)
