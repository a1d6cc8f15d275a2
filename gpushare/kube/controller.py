"""The API calls the controller process makes: watches that feed its view, Bindings and pod
patches for the extender, evictions, leader-election Leases and webhook registration.

The hot paths (pod and node watches, Bindings) go through :class:`~gpushare.kube.raw.RawApi`
(aiohttp + msgspec, plain dicts) when the kubeconfig uses certificates or tokens; everything
else, and exec/basic-auth kubeconfigs, use lightkube's AsyncClient.
"""

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import httpx2
import msgspec
from lightkube import AsyncClient
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.admissionregistration_v1 import (
    MutatingWebhookConfiguration,
    ValidatingWebhookConfiguration,
)
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Pod
from lightkube.resources.scheduling_v1 import PriorityClass
from lightkube.types import PatchType

from gpushare.api.names import ANN_PAUSE
from gpushare.api.pause import PauseRequest
from gpushare.kube.access import AsyncAccessReviewer
from gpushare.kube.certificates import SecretStore
from gpushare.kube.config import load_config
from gpushare.kube.errors import (
    ConflictError,
    LeaseConflictError,
    NotFoundError,
    TooManyRequestsError,
    UnprocessableError,
    translated,
)
from gpushare.kube.events import ObjectRef, Reporter
from gpushare.kube.operator import KubeApi
from gpushare.kube.raw import RawApi
from gpushare.kube.resources import (
    DeviceClassResource,
    ResourceClaimResource,
    ResourceClaimTemplateResource,
)
from gpushare.kube.watching import Watching

PodDict = dict[str, Any]


def _claim_path(namespace: str, name: str) -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"


class Kube:
    """A small typed facade over lightkube (and RawApi for the hot paths) for exactly what the
    controller needs."""

    def __init__(
        self, client: AsyncClient, *, field_manager: str, raw: RawApi | None = None
    ) -> None:
        self._client = client
        self._field_manager = field_manager
        self._raw = raw
        self.inform = Watching(client, raw).inform
        """Objects of a watched kind into callbacks, forever (gpushare.kube.watching)."""

    @classmethod
    def connect(cls, *, kubeconfig: Path | None, field_manager: str) -> "Kube":
        """Build a client from a kubeconfig file, or in-cluster config / $KUBECONFIG."""
        config = load_config(kubeconfig)
        client = AsyncClient(
            config=config,
            field_manager=field_manager,
            timeout=httpx2.Timeout(15.0),
        )
        single = config.get()
        raw = RawApi.from_config(single) if single is not None else None
        return cls(client, field_manager=field_manager, raw=raw)

    async def _raw_patch(self, path: str, body: Any, patch_type: str, what: str) -> dict[str, Any]:
        """A PATCH on the raw session: the claim placement's writes (lightkube's httpx pool
        opened a new TLS connection for about one write in four at 64 writes at once)."""
        assert self._raw is not None
        with translated(what):
            return await self._raw.patch(
                path, body, patch_type=patch_type, field_manager=self._field_manager, what=what
            )

    def operator_api(self) -> KubeApi:
        """The GpuShare operator's calls (gpushare.kube.operator), on this same client."""
        return KubeApi(self._client)

    def access_reviewer(self) -> AsyncAccessReviewer:
        """Checks the bearer tokens of callers of /metrics (gpushare.kube.access)."""
        return AsyncAccessReviewer(self._client)

    def secret_store(self, namespace: str) -> SecretStore:
        """The certificate Secrets of ``namespace`` (gpushare.kube.certificates)."""
        return SecretStore(self._client, namespace=namespace, field_manager=self._field_manager)

    async def close(self) -> None:
        await self._client.close()
        if self._raw is not None:
            await self._raw.close()

    # ---- pods ----------------------------------------------------------------------------

    async def get_pod(self, *, namespace: str, name: str) -> PodDict:
        with translated(f"get pod {namespace}/{name}"):
            pod = await self._client.get(Pod, name, namespace=namespace)
        return dict(pod.to_dict())

    async def bind_pod(
        self,
        *,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """POST pods/<name>/binding. The API server copies the Binding's annotations onto the
        pod in the same update that sets ``spec.nodeName``, so a pod is never bound without
        its placement nor annotated without being bound. The uid makes it refuse a recreated
        pod; a second Binding of a bound pod fails with 409 and writes nothing."""
        what = f"bind pod {namespace}/{name} to {node}"
        if self._raw is not None:
            meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
            if annotations:
                meta["annotations"] = dict(annotations)
            body = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            }
            with translated(what):
                await self._raw.post(
                    f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body, what=what
                )
            return
        binding = Pod.Binding(
            metadata=ObjectMeta(
                name=name,
                namespace=namespace,
                uid=uid,
                annotations=dict(annotations) if annotations else None,
            ),
            target=ObjectReference(apiVersion="v1", kind="Node", name=node),
        )
        with translated(what):
            await self._create_answered_by_status(binding, name, namespace)

    async def _create_answered_by_status(self, body: Any, name: str, namespace: str) -> None:
        """POST a subresource (a Binding, an Eviction) that the API server answers with 201 and
        a Status, which lightkube cannot decode as the body's kind; errors raise before any
        decoding."""
        try:
            await self._client.create(body, name, namespace=namespace)
        except msgspec.ValidationError:
            return

    async def annotate_pod(
        self, *, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> None:
        """Merge-patch the pod's annotations (a Pod update event for kube-scheduler)."""
        await self._merge_pod_metadata(namespace, name, "annotations", annotations)

    async def _merge_pod_metadata(
        self, namespace: str, name: str, part: str, values: Mapping[str, str]
    ) -> None:
        patch = {"metadata": {part: dict(values)}}
        with translated(f"patch {part} of pod {namespace}/{name}"):
            await self._client.patch(
                Pod, name, patch, namespace=namespace, patch_type=PatchType.MERGE
            )

    async def request_pause(
        self, *, namespace: str, name: str, uid: str, request: PauseRequest | None
    ) -> None:
        """Write (``request``) or remove (None) the pod's ``gpushare.io/pause`` with one merge
        patch; ``uid`` (when not empty) makes it a precondition, so a pod recreated under the
        same name is never paused by mistake (ConflictError). NotFoundError when it is gone."""
        metadata: dict[str, Any] = {
            "annotations": {ANN_PAUSE: request.dump() if request is not None else None}
        }
        if uid:
            metadata["uid"] = uid
        with translated(f"patch the pause request of pod {namespace}/{name}"):
            await self._client.patch(
                Pod, name, {"metadata": metadata}, namespace=namespace, patch_type=PatchType.MERGE
            )

    async def evict_pod(self, *, namespace: str, name: str) -> bool:
        """Evict through the Eviction API, so PodDisruptionBudgets hold. False when a budget
        blocks it now (HTTP 429: try later); a pod already gone counts as evicted."""
        body = Pod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace))
        try:
            with translated(f"evict pod {namespace}/{name}"):
                await self._create_answered_by_status(body, name, namespace)
        except NotFoundError:
            return True
        except TooManyRequestsError:
            return False
        return True

    async def _get_or_none(
        self, resource: Any, name: str, *, what: str, namespace: str | None = None
    ) -> Any:
        """``resource`` ``name`` as the client returns it; None when there is none."""
        try:
            with translated(f"get {what}"):
                return await self._client.get(resource, name, namespace=namespace)
        except NotFoundError:
            return None

    async def get_claim_template(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        """A ResourceClaimTemplate's manifest; None when there is none."""
        obj = await self._get_or_none(
            ResourceClaimTemplateResource,
            name,
            namespace=namespace,
            what=f"ResourceClaimTemplate {namespace}/{name}",
        )
        return None if obj is None else dict(obj)

    async def create_claim_template(self, body: Mapping[str, Any]) -> bool:
        """Create a ResourceClaimTemplate; False when one of that name exists already."""
        meta = body["metadata"]
        what = f"create ResourceClaimTemplate {meta['namespace']}/{meta['name']}"
        try:
            with translated(what):
                obj = ResourceClaimTemplateResource.from_dict(dict(body))
                await self._client.create(obj, field_manager=self._field_manager)
        except ConflictError:
            return False
        return True

    async def delete_claim_template(self, *, namespace: str, name: str) -> None:
        """Delete a ResourceClaimTemplate; one already gone is fine."""
        try:
            with translated(f"delete ResourceClaimTemplate {namespace}/{name}"):
                await self._client.delete(ResourceClaimTemplateResource, name, namespace=namespace)
        except NotFoundError:
            return

    # ---- DRA claims the controller places (gpushare.cluster.dra) --------------------------

    async def protect_claim(
        self, *, namespace: str, name: str, resource_version: str, finalizers: list[str]
    ) -> dict[str, Any]:
        """Set the claim's finalizers (``resource_version`` guards against lost updates: a 409
        is a :class:`~gpushare.kube.errors.ConflictError`); returns the claim as stored."""
        what = f"add the finalizer of ResourceClaim {namespace}/{name}"
        patch = {"metadata": {"resourceVersion": resource_version, "finalizers": finalizers}}
        if self._raw is not None:
            return await self._raw_patch(_claim_path(namespace, name), patch, "merge", what)
        with translated(what):
            obj = await self._client.patch(
                ResourceClaimResource, name, patch, namespace=namespace, patch_type=PatchType.MERGE
            )
        return dict(obj)

    async def allocate_claim(
        self,
        *,
        namespace: str,
        name: str,
        resource_version: str,
        allocation: Mapping[str, Any],
        reserved_for: Sequence[Mapping[str, str]] = (),
    ) -> dict[str, Any]:
        """Write ``status.allocation`` of an unallocated claim, as kube-scheduler would
        (``resource_version`` guards it: someone else's allocation in between is a 409), and
        with ``reserved_for`` its ``status.reservedFor`` in the same write."""
        what = f"allocate ResourceClaim {namespace}/{name}"
        status: dict[str, Any] = {"allocation": dict(allocation)}
        if reserved_for:
            status["reservedFor"] = [dict(r) for r in reserved_for]
        patch = {"metadata": {"resourceVersion": resource_version}, "status": status}
        if self._raw is not None:
            path = _claim_path(namespace, name) + "/status"
            return await self._raw_patch(path, patch, "merge", what)
        with translated(what):
            obj = await self._client.patch(
                ResourceClaimResource.Status,
                name,
                patch,
                namespace=namespace,
                patch_type=PatchType.MERGE,
            )
        return dict(obj)

    async def get_priority_class(self, name: str) -> dict[str, Any] | None:
        """A PriorityClass's manifest; None when there is none."""
        obj = await self._get_or_none(PriorityClass, name, what=f"PriorityClass {name}")
        return None if obj is None else dict(obj.to_dict())

    async def get_device_class(self, name: str) -> dict[str, Any] | None:
        """A DeviceClass's manifest; None when there is none."""
        obj = await self._get_or_none(DeviceClassResource, name, what=f"DeviceClass {name}")
        return None if obj is None else dict(obj)

    async def pod_event(
        self, *, pod: Mapping[str, Any], reason: str, message: str, warning: bool
    ) -> None:
        """Record an Event about ``pod`` (``kubectl describe pod`` shows it); a failure is
        logged by the caller's retry, never raised past it."""
        meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
        assert isinstance(meta, Mapping)
        about = ObjectRef.pod(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
        )
        await self.record_event(about=about, reason=reason, message=message, warning=warning)

    async def record_event(
        self, *, about: ObjectRef, reason: str, message: str, warning: bool
    ) -> None:
        """Record an Event about any object (a cluster-scoped one's goes to ``default``);
        a KubeError when the API server refuses it."""
        reporter = Reporter(
            component=self._field_manager,
            reporting_component=self._field_manager,
            instance=self._field_manager,
        )
        event = reporter.event(about, reason=reason, message=message, warning=warning)
        with translated(f"record event {reason} of {about.kind} {about.namespace}/{about.name}"):
            await self._client.create(event)

    async def remove_scheduling_gate(
        self,
        *,
        namespace: str,
        name: str,
        index: int,
        gate: str,
        annotations: Mapping[str, str] | None = None,
        ops: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """Remove ``spec.schedulingGates[index]`` when it still is ``gate`` (a JSON patch whose
        test fails with 422 when the gates moved), applying ``ops`` (JSON patch operations, e.g.
        the node pin of gpushare.cluster.dra.pin) and setting ``annotations`` in the same write
        (the pod must have annotations already)."""
        patch: list[dict[str, Any]] = [
            {"op": "test", "path": f"/spec/schedulingGates/{index}/name", "value": gate},
            {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
            *(dict(op) for op in ops),
        ]
        for key, value in (annotations or {}).items():
            escaped = key.replace("~", "~0").replace("/", "~1")
            patch.append({"op": "add", "path": f"/metadata/annotations/{escaped}", "value": value})
        what = f"remove scheduling gate {gate} of pod {namespace}/{name}"
        if self._raw is not None:
            path = f"/api/v1/namespaces/{namespace}/pods/{name}"
            await self._raw_patch(path, patch, "json", what)
            return
        with translated(what):
            await self._client.patch(
                Pod, name, patch, namespace=namespace, patch_type=PatchType.JSON
            )

    # ---- leader election -----------------------------------------------------------------

    async def get_lease(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        lease = await self._get_or_none(
            Lease, name, namespace=namespace, what=f"lease {namespace}/{name}"
        )
        return None if lease is None else dict(lease.to_dict())

    async def create_lease(
        self, *, namespace: str, name: str, spec: dict[str, Any]
    ) -> dict[str, Any]:
        body = cast(
            Lease,
            Lease.from_dict(
                {"metadata": {"name": name, "namespace": namespace}, "spec": dict(spec)}
            ),
        )
        return await self._write_lease(self._client.create(body), namespace, name)

    async def replace_lease(
        self, *, namespace: str, name: str, lease: dict[str, Any]
    ) -> dict[str, Any]:
        """Replace with the lease's resourceVersion: LeaseConflictError when it moved on."""
        body = cast(Lease, Lease.from_dict(dict(lease)))
        return await self._write_lease(self._client.replace(body), namespace, name)

    async def _write_lease(self, call: Any, namespace: str, name: str) -> dict[str, Any]:
        try:
            with translated(f"write lease {namespace}/{name}"):
                written = await call
        except (ConflictError, UnprocessableError) as exc:
            raise LeaseConflictError(str(exc), status=exc.status) from None
        return dict(written.to_dict())

    async def label_pod(self, *, namespace: str, name: str, labels: Mapping[str, str]) -> None:
        """Merge-patch the pod's labels (the controller's own pod: its leader role)."""
        await self._merge_pod_metadata(namespace, name, "labels", labels)

    # ---- webhook registration ------------------------------------------------------------

    async def register_webhooks(
        self, *, mutating: Mapping[str, Any], validating: Mapping[str, Any]
    ) -> None:
        """Server-side apply both webhook configurations (forcing our fields)."""
        with translated("register admission webhooks"):
            mutating_obj = cast(
                MutatingWebhookConfiguration,
                MutatingWebhookConfiguration.from_dict(dict(mutating)),
            )
            validating_obj = cast(
                ValidatingWebhookConfiguration,
                ValidatingWebhookConfiguration.from_dict(dict(validating)),
            )
            await self._client.apply(mutating_obj, field_manager=self._field_manager, force=True)
            await self._client.apply(validating_obj, field_manager=self._field_manager, force=True)
