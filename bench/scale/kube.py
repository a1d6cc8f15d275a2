"""A small asyncio client for the bench's own API server (client certificate from a kubeconfig).

The bench creates tens of thousands of objects and watches them all; a plain aiohttp session with
a bounded connection pool does that with the least CPU on a shared 2-core machine.
"""

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import yaml

Json = dict[str, Any]


class ApiError(Exception):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        self.status = status
        shown = body if len(body) <= 1000 else f"{body[:400]} ... {body[-600:]}"
        super().__init__(f"{method} {path}: HTTP {status}: {shown}")


def _ssl_from_kubeconfig(path: Path) -> tuple[str, ssl.SSLContext]:
    config = yaml.safe_load(path.read_text())
    context_name = config["current-context"]
    context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
    ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
    ctx.load_cert_chain(user["client-certificate"], user["client-key"])
    return str(cluster["server"]), ctx


def client_ssl(kubeconfig: Path, *, verify: bool) -> ssl.SSLContext:
    """The kubeconfig's client certificate, for components serving their own self-signed
    certificate (kube-scheduler's secure port): ``verify=False`` skips the server check."""
    _, ctx = _ssl_from_kubeconfig(kubeconfig)
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class Api:
    """JSON over HTTPS to one API server."""

    def __init__(self, *, server: str, session: aiohttp.ClientSession) -> None:
        self.server = server.rstrip("/")
        self.session = session

    @classmethod
    def connect(cls, *, kubeconfig: Path, connections: int = 64) -> "Api":
        server, ctx = _ssl_from_kubeconfig(kubeconfig)
        connector = aiohttp.TCPConnector(ssl=ctx, limit=connections)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        return cls(
            server=server, session=aiohttp.ClientSession(connector=connector, timeout=timeout)
        )

    async def close(self) -> None:
        await self.session.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        ok_statuses: tuple[int, ...] = (),
    ) -> Json:
        # Compact, as Go clients send: the API server keeps opaque DRA parameters byte for byte,
        # and a claim stored with spaces in them can no longer be patched ("spec: field is
        # immutable" once a patch re-encodes them).
        data = json.dumps(body, separators=(",", ":")).encode() if body is not None else None
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        async with self.session.request(
            method, self.server + path, data=data, params=params, headers=headers
        ) as resp:
            text = await resp.text()
            if resp.status >= 400 and resp.status not in ok_statuses:
                raise ApiError(resp.status, method, path, text)
            result: Json = json.loads(text) if text else {}
            return result

    async def create(self, path: str, obj: Mapping[str, Any], *, retries: int = 5) -> Json:
        """POST ``obj``; an object that already exists counts as created. Retries throttling
        (429) and transient server errors with a short backoff."""
        for attempt in range(retries + 1):
            try:
                return await self.request("POST", path, body=obj, ok_statuses=(409,))
            except ApiError as exc:
                if exc.status not in (429, 500, 503, 504) or attempt == retries:
                    raise
            except aiohttp.ClientError:
                if attempt == retries:
                    raise
            await asyncio.sleep(0.1 * 2**attempt)
        raise AssertionError("unreachable")

    async def list_all(self, path: str, *, params: Mapping[str, str] | None = None) -> Json:
        """A paginated list folded into one: ``items`` and the last page's resourceVersion."""
        items: list[Json] = []
        query = dict(params or {})
        query["limit"] = "2000"
        while True:
            page = await self.request("GET", path, params=query)
            items += page.get("items", [])
            cont = page.get("metadata", {}).get("continue")
            if not cont:
                return {"items": items, "metadata": page.get("metadata", {})}
            query["continue"] = cont

    async def watch(
        self, path: str, *, resource_version: str, params: Mapping[str, str] | None = None
    ) -> AsyncIterator[Json]:
        """Watch events (dicts with ``type`` and ``object``) from ``resource_version`` on."""
        query = dict(params or {})
        query.update({"watch": "1", "resourceVersion": resource_version, "timeoutSeconds": "3600"})
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with self.session.get(self.server + path, params=query, timeout=timeout) as resp:
            if resp.status >= 400:
                raise ApiError(resp.status, "WATCH", path, await resp.text())
            async for line in resp.content:
                if line.strip():
                    event: Json = json.loads(line)
                    yield event

    async def delete_collection(
        self, path: str, *, label_selector: str, grace_period_seconds: int = 0
    ) -> None:
        await self.request(
            "DELETE",
            path,
            params={
                "labelSelector": label_selector,
                "gracePeriodSeconds": str(grace_period_seconds),
            },
        )


async def follow(
    api: Api,
    path: str,
    *,
    selector: str,
    resource_version: str,
    on_object: Callable[[Json], None],
) -> None:
    """Watch the objects under ``path`` carrying ``selector`` from ``resource_version`` on and
    hand each added or modified one to ``on_object``, until cancelled; a dropped watch resumes
    from the last resourceVersion seen."""
    rv = resource_version
    while True:
        try:
            async for event in api.watch(
                path, resource_version=rv, params={"labelSelector": selector}
            ):
                obj: Json = event.get("object", {})
                if event.get("type") == "ERROR":
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                rv = obj.get("metadata", {}).get("resourceVersion", rv)
                if event.get("type") in ("ADDED", "MODIFIED"):
                    on_object(obj)
        except asyncio.CancelledError:
            raise
        except Exception:  # a dropped watch: resume from the last resourceVersion
            await asyncio.sleep(0.2)
