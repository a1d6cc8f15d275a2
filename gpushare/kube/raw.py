"""JSON for the hot paths: the pod and node watches (one aiohttp session), Bindings and the
patches that place DRA claims (kept connections of their own, lean_client).

At hundreds of pods a second, lightkube's stack (httpx, anyio TLS streams, h11, model objects
turned back into dicts) cost the controller more CPU per pod than the extender's decisions; here
events are decoded straight into dicts with msgspec (docs/scale.md).
"""

import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import msgspec
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import SingleConfig

from gpushare.kube.errors import KubeError, error_for
from gpushare.kube.lean_client import ApiConnections

TOKEN_REREAD_SECONDS = 60.0
"""A token file (in-cluster service account, rotated by the kubelet) is read again this often."""
_decode = msgspec.json.Decoder()
_encode = msgspec.json.Encoder()
PATCH_CONTENT_TYPES = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
}


def _drop_managed_fields(obj: Mapping[str, Any]) -> None:
    """Remove ``metadata.managedFields`` (which manager wrote which field) from a decoded
    object. Nothing in gpushare reads it, and it is most of a pod's or a claim's dicts: kept,
    the objects the controller holds (thousands of pods and claims) cost its cyclic GC several
    times more (measured on the scale bench, docs/dra.md "Known limits")."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)


class RawApi:
    """List, watch and POST as plain dicts (see the module docstring).

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
        self._writes = ApiConnections(server, ssl)

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
        self._writes.close()
        if self._session is not None:
            await self._session.close()

    async def _error(self, resp: aiohttp.ClientResponse, what: str) -> "KubeError":
        return self._error_of(resp.status, await resp.read(), what)

    def _error_of(self, status: int, body: bytes, what: str) -> "KubeError":
        if status == 401:
            self._forget_token()
        message = body[:300].decode(errors="replace")
        try:
            doc = _decode.decode(body)
            if isinstance(doc, dict) and isinstance(doc.get("message"), str):
                message = doc["message"]
        except msgspec.DecodeError:
            pass
        return error_for(status, f"{what}: {message}")

    async def post(
        self, path: str, body: Mapping[str, Any], *, what: str, timeout: float = 15.0
    ) -> None:
        """POST a JSON body; raises a typed KubeError with the API server's message on 4xx/5xx
        (on kept connections: lean_client)."""
        status, answer = await self._writes.request(
            "POST", path, _encode.encode(body), self._headers(), timeout=timeout
        )
        if status >= 400:
            raise self._error_of(status, answer, what)

    async def patch(
        self,
        path: str,
        body: Any,
        *,
        patch_type: str,
        field_manager: str,
        what: str,
        timeout: float = 15.0,
    ) -> dict[str, Any]:
        """PATCH with ``patch_type`` (``merge`` or ``json``); returns the object as stored.
        Raises a typed KubeError with the API server's message on 4xx/5xx (ConflictError for a
        stale resourceVersion, UnprocessableError for a failed JSON-patch test)."""
        if patch_type not in PATCH_CONTENT_TYPES:
            raise ValueError(f"patch_type must be one of {sorted(PATCH_CONTENT_TYPES)}")
        headers = self._headers()
        headers["Content-Type"] = PATCH_CONTENT_TYPES[patch_type]
        status, answer = await self._writes.request(
            "PATCH",
            f"{path}?{urlencode({'fieldManager': field_manager})}",
            _encode.encode(body),
            headers,
            timeout=timeout,
        )
        if status >= 400:
            raise self._error_of(status, answer, what)
        try:
            doc = _decode.decode(answer)
        except msgspec.DecodeError as exc:
            raise KubeError(f"{what}: the answer is not JSON: {exc}") from None
        return doc if isinstance(doc, dict) else {}

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
            page_items = page.get("items") or []
            for item in page_items:
                if isinstance(item, dict):
                    _drop_managed_fields(item)
            items += page_items
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                return items, str(meta.get("resourceVersion", ""))
            params["continue"] = meta["continue"]

    async def watch(
        self, path: str, *, resource_version: str, timeout_seconds: int, what: str
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(event type, object) from ``resource_version`` on; an ERROR event (410 Gone when
        the version is too old) raises the typed KubeError of its code (GoneError)."""
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
                if isinstance(obj, dict):
                    _drop_managed_fields(obj)
                kind = str(event.get("type", ""))
                if kind == "ERROR":
                    raise error_for(int(obj.get("code") or 0), f"{what}: {obj.get('message')}")
                yield kind, obj
