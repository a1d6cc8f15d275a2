"""The one module of the cluster side that talks to the Kubernetes API (lightkube AsyncClient).

It feeds the view from list+watch of nodes and pods, writes a pod's placement annotations and
Binding for the extender, and registers the admission webhooks.
"""

import asyncio
import gc
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import httpx2
import msgspec
from lightkube import ALL_NS, ApiError, AsyncClient
from lightkube.config.kubeconfig import KubeConfig
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.admissionregistration_v1 import (
    MutatingWebhookConfiguration,
    ValidatingWebhookConfiguration,
)
from lightkube.resources.core_v1 import Node, Pod

from gpushare.api.gpushare_crd import KIND, PLURAL
from gpushare.api.names import GROUP, VERSION
from gpushare.controller.view import ClusterView

log = logging.getLogger(__name__)

GpuShareResource = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)

PodDict = dict[str, Any]


class KubeError(Exception):
    """An API call that failed; ``status`` is the HTTP status (0 when none came back)."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def _wrap(exc: Exception, what: str) -> KubeError:
    if isinstance(exc, ApiError):
        code = int(exc.status.code or 0)
        return KubeError(f"{what}: {exc.status.message or exc}", status=code)
    return KubeError(f"{what}: {type(exc).__name__}: {exc}")


class Kube:
    """A small typed facade over lightkube for exactly what the controller needs."""

    def __init__(self, client: AsyncClient, *, field_manager: str) -> None:
        self._client = client
        self._field_manager = field_manager

    @classmethod
    def connect(cls, *, kubeconfig: Path | None, field_manager: str) -> "Kube":
        """Build a client from a kubeconfig file, or in-cluster config / $KUBECONFIG."""
        config = (
            KubeConfig.from_file(kubeconfig) if kubeconfig is not None else KubeConfig.from_env()
        )
        client = AsyncClient(
            config=config,
            field_manager=field_manager,
            timeout=httpx2.Timeout(15.0),
        )
        return cls(client, field_manager=field_manager)

    async def close(self) -> None:
        await self._client.close()

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

    # ---- watches -------------------------------------------------------------------------

    async def _informer(
        self,
        res: Any,
        *,
        replace: Callable[[Iterable[Mapping[str, Any]]], None],
        upsert: Callable[[Mapping[str, Any]], object],
        delete: Callable[[Mapping[str, Any]], None],
        resync_seconds: float,
        namespaced: bool = False,
    ) -> None:
        """List, then watch from the list's resourceVersion, in every namespace for namespaced
        kinds (lightkube's default is the kubeconfig's namespace only). Re-list on 410 Gone, on
        any error (after a backoff) and every ``resync_seconds``. Never returns."""
        kind = res.__name__
        backoff = 0.5
        while True:
            try:
                scope: dict[str, Any] = {"namespace": ALL_NS} if namespaced else {}
                listing = self._client.list(res, chunk_size=500, **scope)
                items: list[dict[str, Any]] = [obj.to_dict() async for obj in listing]
                version = listing.resourceVersion
                replace(items)
                count = len(items)
                del items
                # The view is long-lived: keep the cyclic GC from rescanning it on every
                # collection (that showed as 10+ ms tails in extender latency).
                gc.collect()
                gc.freeze()
                log.info("listed", extra={"kind": kind, "count": count, "rv": version})
                backoff = 0.5
                async with asyncio.timeout(resync_seconds):
                    async for event, obj in self._client.watch(
                        res,
                        resource_version=version,
                        server_timeout=int(resync_seconds),
                        **scope,
                    ):
                        data: dict[str, Any] = obj.to_dict()
                        if event == "DELETED":
                            delete(data)
                        elif event in ("ADDED", "MODIFIED"):
                            upsert(data)
            except TimeoutError:
                continue  # periodic re-list
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                code = exc.status.code
                if code != 410:
                    log.warning("watch failed", extra={"kind": kind, "error": str(exc)})
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 10.0)
            except Exception as exc:
                log.warning(
                    "watch failed", extra={"kind": kind, "error": f"{type(exc).__name__}: {exc}"}
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def feed_nodes(self, view: ClusterView, *, resync_seconds: float) -> None:
        def delete(data: Mapping[str, Any]) -> None:
            view.delete_node(str(data.get("metadata", {}).get("name", "")))

        await self._informer(
            Node,
            replace=view.replace_nodes,
            upsert=view.upsert_node,
            delete=delete,
            resync_seconds=resync_seconds,
        )

    async def feed_pods(self, view: ClusterView, *, resync_seconds: float) -> None:
        def upsert(data: Mapping[str, Any]) -> None:
            f = view.upsert_pod(data)
            if f is not None and log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "pod event",
                    extra={
                        "pod": f.key,
                        "node": f.node,
                        "phase": f.phase,
                        "state": f.placement.state if f.placement else None,
                        "awaiting": f.awaiting_allocation,
                    },
                )
            if f is not None and f.problem is not None:
                log.warning("pod annotations unreadable", extra={"pod": f.key, "error": f.problem})

        def delete(data: Mapping[str, Any]) -> None:
            meta = data.get("metadata", {})
            view.delete_pod(f"{meta.get('namespace', 'default')}/{meta.get('name', '')}")

        await self._informer(
            Pod,
            replace=view.replace_pods,
            upsert=upsert,
            delete=delete,
            resync_seconds=resync_seconds,
            namespaced=True,
        )

    async def feed_shares(self, view: ClusterView, *, resync_seconds: float) -> None:
        """GpuShare statuses for the extender's hold rule (gpushare.controller.share_rules)."""
        await self._informer(
            GpuShareResource,
            replace=view.replace_shares,
            upsert=view.upsert_share,
            delete=view.delete_share,
            resync_seconds=resync_seconds,
            namespaced=True,
        )

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
