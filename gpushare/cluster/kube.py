"""The one module of the cluster side that talks to the Kubernetes API.

It feeds the view from list+watch of nodes and pods, writes a pod's placement annotations and
Binding for the extender, and registers the admission webhooks. The hot paths (pod and node
watches, Bindings) go through :class:`RawApi` (aiohttp + msgspec, plain dicts) when the
kubeconfig uses certificates or tokens; everything else, and exec/basic-auth kubeconfigs, use
lightkube's AsyncClient.
"""

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import aiohttp
import httpx2
import msgspec
from lightkube import ALL_NS, ApiError, AsyncClient
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import KubeConfig, SingleConfig
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.admissionregistration_v1 import (
    MutatingWebhookConfiguration,
    ValidatingWebhookConfiguration,
)
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Namespace, Node, Pod
from lightkube.types import PatchType

from gpushare.api.gpushare_crd import KIND, PLURAL
from gpushare.api.names import GROUP, VERSION
from gpushare.cluster.leader import LeaseConflictError
from gpushare.cluster.state.view import ClusterView

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


TOKEN_REREAD_SECONDS = 60.0
"""A token file (in-cluster service account, rotated by the kubelet) is read again this often."""
_decode = msgspec.json.Decoder()
_encode = msgspec.json.Encoder()


class RawApi:
    """JSON over one aiohttp session, for the hot paths: the pod and node watches and the
    Binding POST. At hundreds of pods a second, lightkube's stack (httpx, anyio TLS streams,
    h11, model objects turned back into dicts) cost the controller more CPU per pod than the
    extender's decisions; here events are decoded straight into dicts with msgspec.

    Built only for kubeconfigs with client certificates, a token or a token file (in-cluster
    service accounts); anything else (exec plugins, basic auth) stays on lightkube."""

    def __init__(
        self, *, server: str, ssl: Any, token: str | None, token_file: Path | None
    ) -> None:
        self._server = server.rstrip("/")
        self._ssl = ssl
        self._token = token
        self._token_file = token_file
        self._token_read = -1e9
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_config(cls, config: SingleConfig) -> "RawApi | None":
        user = config.user
        if user is None or user.exec is not None or user.username or user.auth_provider:
            return None
        if not config.cluster.server.startswith(("https://", "http://")):
            return None
        token_file = Path(config.abs_file(user.token_file)) if user.token_file else None
        ssl = None
        if config.cluster.server.startswith("https://"):
            ssl = verify_cluster(config.cluster, user, config.abs_file)
        return cls(server=config.cluster.server, ssl=ssl, token=user.token, token_file=token_file)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if self._token_file is not None:
            now = time.monotonic()
            if now - self._token_read > TOKEN_REREAD_SECONDS:
                self._token = self._token_file.read_text().strip()
                self._token_read = now
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    def _forget_token(self) -> None:
        """After a 401: read the token file again on the next request (it was rotated)."""
        self._token_read = -1e9

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else False),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _error(self, resp: aiohttp.ClientResponse, what: str) -> "KubeError":
        body = await resp.read()
        if resp.status == 401:
            self._forget_token()
        message = body[:300].decode(errors="replace")
        try:
            doc = _decode.decode(body)
            if isinstance(doc, dict) and isinstance(doc.get("message"), str):
                message = doc["message"]
        except msgspec.DecodeError:
            pass
        return KubeError(f"{what}: {message}", status=resp.status)

    async def post(
        self, path: str, body: Mapping[str, Any], *, what: str, timeout: float = 15.0
    ) -> None:
        """POST a JSON body; raises KubeError with the API server's message on 4xx/5xx."""
        async with self.session().post(
            self._server + path,
            data=_encode.encode(body),
            headers=self._headers(),
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as resp:
            if resp.status >= 400:
                raise await self._error(resp, what)
            await resp.read()

    async def list(self, path: str, *, what: str) -> tuple[list[dict[str, Any]], str]:
        """Every item of a (paginated) list, and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        params = {"limit": "500"}
        while True:
            async with self.session().get(
                self._server + path,
                params=params,
                headers=self._headers(),
                timeout=aiohttp.ClientTimeout(total=60),
            ) as resp:
                if resp.status >= 400:
                    raise await self._error(resp, what)
                page = _decode.decode(await resp.read())
            items += page.get("items") or []
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                return items, str(meta.get("resourceVersion", ""))
            params["continue"] = meta["continue"]

    async def watch(
        self, path: str, *, resource_version: str, timeout_seconds: int, what: str
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(event type, object) from ``resource_version`` on; an ERROR event (410 Gone when
        the version is too old) raises KubeError with its code."""
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
            "allowWatchBookmarks": "false",
        }
        async with self.session().get(
            self._server + path,
            params=params,
            headers=self._headers(),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        ) as resp:
            if resp.status >= 400:
                raise await self._error(resp, what)
            async for line in resp.content:
                if not line.strip():
                    continue
                event = _decode.decode(line)
                obj = event.get("object") or {}
                kind = str(event.get("type", ""))
                if kind == "ERROR":
                    raise KubeError(
                        f"{what}: {obj.get('message')}", status=int(obj.get("code") or 0)
                    )
                yield kind, obj


POISON_LOG_EVERY = 100
"""One warning per this many objects a watch could not take in (after the first)."""
_poisoned: dict[str, int] = {}


def poisoned_events(kind: str) -> int:
    """Watch events of ``kind`` the view could not take in since the process began."""
    return _poisoned.get(kind, 0)


def _apply_event(
    kind: str,
    event: str,
    data: Mapping[str, Any],
    *,
    upsert: Callable[[Mapping[str, Any]], object],
    delete: Callable[[Mapping[str, Any]], None],
) -> None:
    """Hand one watch event to the view. An object the view cannot take in (a bug: parsing is
    total) is logged and skipped, so one poison object never stops the watch: re-listing would
    meet it again and the watch would never run (docs/security.md)."""
    try:
        if event == "DELETED":
            delete(data)
        elif event in ("ADDED", "MODIFIED"):
            upsert(data)
    except Exception as exc:
        count = _poisoned[kind] = _poisoned.get(kind, 0) + 1
        if count == 1 or count % POISON_LOG_EVERY == 0:
            raw_meta = data.get("metadata")
            meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
            log.error(
                "watch event skipped: the view could not take the object in",
                extra={
                    "kind": kind,
                    "object": f"{meta.get('namespace', '')}/{meta.get('name', '')}",
                    "error": f"{type(exc).__name__}: {str(exc)[:200]}",
                    "skipped": count,
                },
            )


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
        config = (
            KubeConfig.from_file(kubeconfig) if kubeconfig is not None else KubeConfig.from_env()
        )
        client = AsyncClient(
            config=config,
            field_manager=field_manager,
            timeout=httpx2.Timeout(15.0),
        )
        single = config.get()
        raw = RawApi.from_config(single) if single is not None else None
        return cls(client, field_manager=field_manager, raw=raw)

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
        raw_path: str | None = None,
    ) -> None:
        """List, then watch from the list's resourceVersion, in every namespace for namespaced
        kinds (lightkube's default is the kubeconfig's namespace only). Re-list on 410 Gone, on
        any error (after a backoff) and every ``resync_seconds``. Never returns.

        With ``raw_path`` (the collection's URL path) and a kubeconfig RawApi supports, events
        come as plain dicts decoded by msgspec instead of through lightkube's models."""
        kind = res.__name__
        backoff = 0.5
        while True:
            try:
                items, version = await self._list(res, namespaced=namespaced, raw_path=raw_path)
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
                    async for event, data in self._watch(
                        res,
                        version=version,
                        timeout_seconds=int(resync_seconds),
                        namespaced=namespaced,
                        raw_path=raw_path,
                    ):
                        _apply_event(kind, event, data, upsert=upsert, delete=delete)
            except TimeoutError:
                continue  # periodic re-list
            except asyncio.CancelledError:
                raise
            except (ApiError, KubeError) as exc:
                code = exc.status.code if isinstance(exc, ApiError) else exc.status
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

    async def _list(
        self, res: Any, *, namespaced: bool, raw_path: str | None
    ) -> tuple[list[dict[str, Any]], str]:
        if raw_path is not None and self._raw is not None:
            return await self._raw.list(raw_path, what=f"list {res.__name__}")
        scope: dict[str, Any] = {"namespace": ALL_NS} if namespaced else {}
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
        scope: dict[str, Any] = {"namespace": ALL_NS} if namespaced else {}
        async for event, obj in self._client.watch(
            res, resource_version=version, server_timeout=timeout_seconds, **scope
        ):
            yield event, obj.to_dict()

    async def feed_nodes(self, view: ClusterView, *, resync_seconds: float) -> None:
        def delete(data: Mapping[str, Any]) -> None:
            view.delete_node(str(data.get("metadata", {}).get("name", "")))

        await self._informer(
            Node,
            replace=view.replace_nodes,
            upsert=view.upsert_node,
            delete=delete,
            resync_seconds=resync_seconds,
            raw_path="/api/v1/nodes",
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
            raw_path="/api/v1/pods",
        )

    async def feed_shares(self, view: ClusterView, *, resync_seconds: float) -> None:
        """GpuShare statuses for the extender's hold rule (gpushare.cluster.state.share_rules)."""
        await self._informer(
            GpuShareResource,
            replace=view.replace_shares,
            upsert=view.upsert_share,
            delete=view.delete_share,
            resync_seconds=resync_seconds,
            namespaced=True,
        )

    async def feed_namespaces(self, view: ClusterView, *, resync_seconds: float) -> None:
        """Namespace labels an admin sets: sharing groups and neighbour-rule grants
        (gpushare.cluster.state.tenancy)."""
        await self._informer(
            Namespace,
            replace=view.replace_namespaces,
            upsert=view.upsert_namespace,
            delete=view.delete_namespace,
            resync_seconds=resync_seconds,
            raw_path="/api/v1/namespaces",
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
