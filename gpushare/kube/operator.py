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

from lightkube import AsyncClient
from lightkube.models.meta_v1 import DeleteOptions, ObjectMeta, Preconditions
from lightkube.resources.core_v1 import ConfigMap, Namespace, Node, Pod
from lightkube.types import PatchType

from gpushare.api.names import GROUP
from gpushare.kube.errors import (
    ConflictError,
    KubeError,
    NotFoundError,
    TooManyRequestsError,
    UnprocessableError,
    translated,
)
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
    """The operator's calls, on the process's one client (``gpushare.kube.controller.Kube``
    lends it: :meth:`~gpushare.kube.controller.Kube.operator_api`); its writes carry the
    operator's own field manager."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self._instance = socket.gethostname()

    async def _merge(
        self, resource: Any, namespace: str, name: str, patch: dict[str, Any], *, what: str
    ) -> bool:
        """Merge-patch object ``namespace/name`` of ``resource``; False when there is none."""
        try:
            with translated(what):
                await self._client.patch(
                    resource,
                    name,
                    patch,
                    namespace=namespace,
                    patch_type=PatchType.MERGE,
                    field_manager=FIELD_MANAGER,
                )
        except NotFoundError:
            return False
        return True

    async def list_pods(self, *, namespace: str | None) -> list[dict[str, Any]]:
        """Every pod of ``namespace`` (None: all namespaces), as API JSON."""
        with translated("list pods"):
            found = self._client.list(Pod, namespace=namespace or "*", chunk_size=500)
            return [dict(pod.to_dict()) async for pod in found]

    async def list_labelled_pods(
        self, *, namespace: str, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        """The pods of ``namespace`` carrying every label of ``labels`` (the server filters;
        empty: every pod of the namespace), as API JSON."""
        with translated("list pods"):
            found = self._client.list(
                Pod, namespace=namespace, labels=dict(labels) or None, chunk_size=500
            )
            return [dict(pod.to_dict()) async for pod in found]

    async def namespace_labels(self, name: str) -> dict[str, str]:
        """The labels of Namespace ``name`` ({} when it is gone)."""
        try:
            with translated(f"get Namespace {name}"):
                found = await self._client.get(Namespace, name)
        except NotFoundError:
            return {}
        return dict((found.metadata.labels if found.metadata else None) or {})

    async def list_nodes(self) -> list[dict[str, Any]]:
        with translated("list nodes"):
            return [dict(node.to_dict()) async for node in self._client.list(Node, chunk_size=500)]

    async def get_share(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            with translated(f"get GpuShare {namespace}/{name}"):
                obj = await self._client.get(GpuShareResource, name, namespace=namespace)
        except NotFoundError:
            return None
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
            with translated(f"patch status of GpuShare {namespace}/{name}"):
                await self._client.patch(
                    GpuShareResource.Status,
                    name,
                    [dict(op) for op in ops],
                    namespace=namespace,
                    patch_type=PatchType.JSON,
                    field_manager=FIELD_MANAGER,
                )
        except NotFoundError:
            return False
        except UnprocessableError as exc:
            # A failed "test" op is a 422 without causes; a schema violation lists its causes.
            if exc.causes:
                raise
            log.info("share %s/%s: status changed meanwhile; step not taken", namespace, name)
            return False
        return True

    async def merge_share_status(
        self, *, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        """Merge-patch fields of the share's status that are pure functions of the cluster
        (placements, pod count): writing them twice is harmless."""
        await self._merge(
            GpuShareResource.Status,
            namespace,
            name,
            {"status": dict(status)},
            what=f"merge status of GpuShare {namespace}/{name}",
        )

    async def annotate_pod(
        self, *, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> bool:
        """Merge annotations into a pod (None removes one). False when the pod is gone."""
        return await self._merge(
            Pod,
            namespace,
            name,
            {"metadata": {"annotations": dict(annotations)}},
            what=f"annotate pod {namespace}/{name}",
        )

    async def evict(self, *, namespace: str, name: str, uid: str | None = None) -> EvictionOutcome:
        """Evict through the Eviction API, so PodDisruptionBudgets are respected. With
        ``uid``, only that pod: one recreated under the same name meanwhile is not evicted
        (the API server answers 409, taken as gone)."""
        body = Pod.Eviction(
            metadata=ObjectMeta(name=name, namespace=namespace),
            deleteOptions=DeleteOptions(preconditions=Preconditions(uid=uid)) if uid else None,
        )
        try:
            with translated(f"evict pod {namespace}/{name}"):
                await self._client.create(
                    body, name, namespace=namespace, field_manager=FIELD_MANAGER
                )
        except TooManyRequestsError:
            return EvictionOutcome.BLOCKED
        except (NotFoundError, ConflictError):
            return EvictionOutcome.GONE
        return EvictionOutcome.EVICTED

    async def post_event(
        self, *, about: ObjectRef, reason: str, message: str, warning: bool = False
    ) -> None:
        """A core/v1 Event on ``about`` (shown by kubectl describe). Failures are logged, not
        raised: an Event is a report, never a reason to repeat the step it reports."""
        reporter = Reporter(COMPONENT, f"{GROUP}/operator", instance=self._instance)
        body = reporter.event(about, reason=reason, message=message, warning=warning)
        try:
            with translated(f"post event {reason}"):
                await self._client.create(body, field_manager=FIELD_MANAGER)
        except KubeError as exc:
            log.warning("could not post event %s on %s/%s: %s", reason, about.kind, about.name, exc)

    async def read_configmap(self, *, namespace: str, name: str) -> dict[str, str]:
        try:
            with translated(f"get ConfigMap {namespace}/{name}"):
                cm = await self._client.get(ConfigMap, name, namespace=namespace)
        except NotFoundError:
            return {}
        return dict(cm.data or {})

    async def put_configmap_entries(
        self, *, namespace: str, name: str, entries: Mapping[str, str | None]
    ) -> None:
        """Set (or, with None, delete) keys of a ConfigMap, creating it when absent."""
        if await self._merge(
            ConfigMap,
            namespace,
            name,
            {"data": dict(entries)},
            what=f"patch ConfigMap {namespace}/{name}",
        ):
            return
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
            with translated(f"create ConfigMap {namespace}/{name}"):
                await self._client.create(cm, field_manager=FIELD_MANAGER)
        except ConflictError:
            await self.put_configmap_entries(namespace=namespace, name=name, entries=entries)
