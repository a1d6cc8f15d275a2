"""The API calls the controller process makes: watches that feed its view, Bindings and pod
patches for the extender, evictions, leader-election Leases and webhook registration.

The hot paths (pod and node watches, Bindings) go through :class:`~gpushare.kube.raw.RawApi`
(aiohttp + msgspec, plain dicts) when the kubeconfig uses certificates or tokens; everything
else, and exec/basic-auth kubeconfigs, use lightkube's AsyncClient.
"""

import enum
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import httpx2
import msgspec
from lightkube import ALL_NS, ApiError, AsyncClient
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.admissionregistration_v1 import (
    MutatingWebhookConfiguration,
    ValidatingWebhookConfiguration,
)
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Namespace, Node, Pod
from lightkube.resources.scheduling_v1 import PriorityClass
from lightkube.types import PatchType

from gpushare.kube.access import AsyncAccessReviewer
from gpushare.kube.config import load_config
from gpushare.kube.errors import KubeError, LeaseConflictError
from gpushare.kube.errors import wrap as _wrap
from gpushare.kube.events import ObjectRef, Reporter
from gpushare.kube.informer import Objects, inform
from gpushare.kube.raw import RawApi
from gpushare.kube.resources import (
    DeviceClassResource,
    GpuShareResource,
    ResourceClaimResource,
    ResourceClaimTemplateResource,
    ResourceSliceResource,
)

PodDict = dict[str, Any]


class Watched(enum.Enum):
    """What the controller watches."""

    NODES = "nodes"
    PODS = "pods"
    SHARES = "gpushares"
    NAMESPACES = "namespaces"
    RESOURCE_SLICES = "resourceslices"
    RESOURCE_CLAIMS = "resourceclaims"
    CLAIM_TEMPLATES = "resourceclaimtemplates"


_WATCHED: dict[Watched, tuple[Any, bool, str | None]] = {
    Watched.NODES: (Node, False, "/api/v1/nodes"),
    Watched.PODS: (Pod, True, "/api/v1/pods"),
    Watched.SHARES: (GpuShareResource, True, None),
    Watched.NAMESPACES: (Namespace, False, "/api/v1/namespaces"),
    Watched.RESOURCE_SLICES: (
        ResourceSliceResource,
        False,
        "/apis/resource.k8s.io/v1/resourceslices",
    ),
    Watched.RESOURCE_CLAIMS: (
        ResourceClaimResource,
        True,
        "/apis/resource.k8s.io/v1/resourceclaims",
    ),
    Watched.CLAIM_TEMPLATES: (
        ResourceClaimTemplateResource,
        True,
        "/apis/resource.k8s.io/v1/resourceclaimtemplates",
    ),
}
"""Each kind: lightkube resource, namespaced, path for the raw (msgspec) watch."""


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
        try:
            return await self._raw.patch(
                path, body, patch_type=patch_type, field_manager=self._field_manager, what=what
            )
        except KubeError:
            raise
        except Exception as exc:
            raise _wrap(exc, what) from exc

    def access_reviewer(self) -> AsyncAccessReviewer:
        """Checks the bearer tokens of callers of /metrics (gpushare.kube.access)."""
        return AsyncAccessReviewer(self._client)

    async def close(self) -> None:
        await self._client.close()
        if self._raw is not None:
            await self._raw.close()

    # ---- pods ----------------------------------------------------------------------------

    async def get_pod(self, *, namespace: str, name: str) -> PodDict:
        try:
            pod = await self._client.get(Pod, name, namespace=namespace)
        except Exception as exc:
            raise _wrap(exc, f"get pod {namespace}/{name}") from exc
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
            what = f"bind pod {namespace}/{name} to {node}"
            try:
                await self._raw.post(
                    f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body, what=what
                )
            except KubeError:
                raise
            except Exception as exc:
                raise _wrap(exc, what) from exc
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
        try:
            await self._client.create(binding, name, namespace=namespace)
        except msgspec.ValidationError:
            # 201 Created: the API server answers a Binding with a Status, which lightkube
            # cannot decode as a Binding. Errors raise ApiError before any decoding.
            return
        except Exception as exc:
            raise _wrap(exc, f"bind pod {namespace}/{name} to {node}") from exc

    async def annotate_pod(
        self, *, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> None:
        """Merge-patch the pod's annotations (a Pod update event for kube-scheduler)."""
        await self._merge_pod_metadata(namespace, name, "annotations", annotations)

    async def _merge_pod_metadata(
        self, namespace: str, name: str, part: str, values: Mapping[str, str]
    ) -> None:
        patch = {"metadata": {part: dict(values)}}
        try:
            await self._client.patch(
                Pod, name, patch, namespace=namespace, patch_type=PatchType.MERGE
            )
        except Exception as exc:
            raise _wrap(exc, f"patch {part} of pod {namespace}/{name}") from exc

    async def evict_pod(self, *, namespace: str, name: str) -> bool:
        """Evict through the Eviction API, so PodDisruptionBudgets hold. False when a budget
        blocks it now (HTTP 429: try later); a pod already gone counts as evicted."""
        body = Pod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace))
        try:
            await self._client.create(body, name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return True
            if exc.status.code == 429:
                return False
            raise _wrap(exc, f"evict pod {namespace}/{name}") from exc
        except msgspec.ValidationError:
            return True  # 201 with a Status body, as for a Binding
        return True

    async def _get_or_none(
        self, resource: Any, name: str, *, what: str, namespace: str | None = None
    ) -> Any:
        """``resource`` ``name`` as the client returns it; None on 404; KubeError else."""
        try:
            return await self._client.get(resource, name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise _wrap(exc, f"get {what}") from exc
        except Exception as exc:
            raise _wrap(exc, f"get {what}") from exc

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
            obj = ResourceClaimTemplateResource.from_dict(dict(body))
            await self._client.create(obj, field_manager=self._field_manager)
        except ApiError as exc:
            if exc.status.code == 409:
                return False
            raise _wrap(exc, what) from exc
        except Exception as exc:
            raise _wrap(exc, what) from exc
        return True

    async def delete_claim_template(self, *, namespace: str, name: str) -> None:
        """Delete a ResourceClaimTemplate; one already gone is fine."""
        try:
            await self._client.delete(ResourceClaimTemplateResource, name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return
            raise _wrap(exc, f"delete ResourceClaimTemplate {namespace}/{name}") from exc
        except Exception as exc:
            raise _wrap(exc, f"delete ResourceClaimTemplate {namespace}/{name}") from exc

    # ---- DRA claims the controller places (gpushare.cluster.dra) --------------------------

    async def protect_claim(
        self, *, namespace: str, name: str, resource_version: str, finalizers: list[str]
    ) -> dict[str, Any]:
        """Set the claim's finalizers (``resource_version`` guards against lost updates: a 409
        is a :class:`KubeError` with status 409); returns the claim as stored."""
        what = f"add the finalizer of ResourceClaim {namespace}/{name}"
        patch = {"metadata": {"resourceVersion": resource_version, "finalizers": finalizers}}
        if self._raw is not None:
            return await self._raw_patch(_claim_path(namespace, name), patch, "merge", what)
        try:
            obj = await self._client.patch(
                ResourceClaimResource, name, patch, namespace=namespace, patch_type=PatchType.MERGE
            )
        except Exception as exc:
            raise _wrap(exc, what) from exc
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
        try:
            obj = await self._client.patch(
                ResourceClaimResource.Status,
                name,
                patch,
                namespace=namespace,
                patch_type=PatchType.MERGE,
            )
        except Exception as exc:
            raise _wrap(exc, what) from exc
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
        KubeError when the API server refuses it."""
        reporter = Reporter(
            component=self._field_manager,
            reporting_component=self._field_manager,
            instance=self._field_manager,
        )
        event = reporter.event(about, reason=reason, message=message, warning=warning)
        try:
            await self._client.create(event)
        except Exception as exc:
            raise _wrap(
                exc, f"record event {reason} of {about.kind} {about.namespace}/{about.name}"
            ) from exc

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
        try:
            await self._client.patch(
                Pod, name, patch, namespace=namespace, patch_type=PatchType.JSON
            )
        except Exception as exc:
            raise _wrap(exc, what) from exc

    # ---- watches -------------------------------------------------------------------------

    async def _informer(
        self,
        res: Any,
        *,
        replace: Callable[[Objects], None],
        upsert: Callable[[Mapping[str, Any]], object],
        delete: Callable[[Mapping[str, Any]], None],
        resync_seconds: float,
        namespaced: bool = False,
        raw_path: str | None = None,
        namespace: str | None = None,
    ) -> None:
        """:func:`~gpushare.kube.informer.inform` for one resource, in every namespace for
        namespaced kinds (lightkube's default is the kubeconfig's namespace only) unless
        ``namespace`` names one. With
        ``raw_path`` (the collection's URL path) and a kubeconfig RawApi supports, objects
        come as plain dicts decoded by msgspec instead of through lightkube's models."""

        async def list_all() -> tuple[list[dict[str, Any]], str]:
            return await self._list(
                res, namespaced=namespaced, raw_path=raw_path, namespace=namespace
            )

        def watch(version: str, timeout_seconds: int) -> AsyncIterator[tuple[str, dict[str, Any]]]:
            return self._watch(
                res,
                version=version,
                timeout_seconds=timeout_seconds,
                namespaced=namespaced,
                raw_path=raw_path,
                namespace=namespace,
            )

        await inform(
            res.__name__,
            list_all=list_all,
            watch=watch,
            replace=replace,
            upsert=upsert,
            delete=delete,
            resync_seconds=resync_seconds,
        )

    async def _list(
        self, res: Any, *, namespaced: bool, raw_path: str | None, namespace: str | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        if raw_path is not None and self._raw is not None:
            return await self._raw.list(raw_path, what=f"list {res.__name__}")
        scope: dict[str, Any] = {"namespace": namespace or ALL_NS} if namespaced else {}
        listing = self._client.list(res, chunk_size=500, **scope)
        items: list[dict[str, Any]] = [obj.to_dict() async for obj in listing]
        return items, str(listing.resourceVersion)

    async def _watch(
        self,
        res: Any,
        *,
        version: str,
        timeout_seconds: int,
        namespaced: bool,
        raw_path: str | None,
        namespace: str | None = None,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        if raw_path is not None and self._raw is not None:
            async for event, data in self._raw.watch(
                raw_path,
                resource_version=version,
                timeout_seconds=timeout_seconds,
                what=f"watch {res.__name__}",
            ):
                yield event, data
            return
        scope: dict[str, Any] = {"namespace": namespace or ALL_NS} if namespaced else {}
        async for event, obj in self._client.watch(
            res, resource_version=version, server_timeout=timeout_seconds, **scope
        ):
            yield event, obj.to_dict()

    async def inform(
        self,
        kind: "Watched",
        *,
        replace: Callable[[Objects], None],
        upsert: Callable[[Mapping[str, Any]], object],
        delete: Callable[[Mapping[str, Any]], None],
        resync_seconds: float,
    ) -> None:
        """Objects of ``kind`` (every namespace's, for namespaced kinds) into the callbacks,
        forever (see :meth:`_informer`)."""
        res, namespaced, raw_path = _WATCHED[kind]
        await self._informer(
            res,
            replace=replace,
            upsert=upsert,
            delete=delete,
            resync_seconds=resync_seconds,
            namespaced=namespaced,
            raw_path=raw_path,
        )

    async def inform_agent_leases(
        self,
        *,
        namespace: str,
        replace: Callable[[Objects], None],
        upsert: Callable[[Mapping[str, Any]], object],
        delete: Callable[[Mapping[str, Any]], None],
        resync_seconds: float,
    ) -> None:
        """The Leases of ``namespace`` (the release's: the node agents' among them,
        gpushare.api.agent_lease) into the callbacks, forever."""
        await self._informer(
            Lease,
            replace=replace,
            upsert=upsert,
            delete=delete,
            resync_seconds=resync_seconds,
            namespaced=True,
            namespace=namespace,
        )

    # ---- leader election -----------------------------------------------------------------

    async def get_lease(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            lease = await self._client.get(Lease, name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise _wrap(exc, f"get lease {namespace}/{name}") from exc
        except Exception as exc:
            raise _wrap(exc, f"get lease {namespace}/{name}") from exc
        return dict(lease.to_dict())

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
            written = await call
        except ApiError as exc:
            if exc.status.code in (409, 422):
                raise LeaseConflictError(str(exc.status.message)) from None
            raise _wrap(exc, f"write lease {namespace}/{name}") from exc
        except Exception as exc:
            raise _wrap(exc, f"write lease {namespace}/{name}") from exc
        return dict(written.to_dict())

    async def label_pod(self, *, namespace: str, name: str, labels: Mapping[str, str]) -> None:
        """Merge-patch the pod's labels (the controller's own pod: its leader role)."""
        await self._merge_pod_metadata(namespace, name, "labels", labels)

    # ---- webhook registration ------------------------------------------------------------

    async def register_webhooks(
        self, *, mutating: Mapping[str, Any], validating: Mapping[str, Any]
    ) -> None:
        """Server-side apply both webhook configurations (forcing our fields)."""
        try:
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
        except Exception as exc:
            raise _wrap(exc, "register admission webhooks") from exc
