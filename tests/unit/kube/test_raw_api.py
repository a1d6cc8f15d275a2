"""The controller's raw API path (watches and Bindings without lightkube's models): which
kubeconfigs it serves and how it authenticates."""

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web
from lightkube.config.kubeconfig import KubeConfig

from gpushare.cluster.dra.writes import MAX_WRITES
from gpushare.kube.errors import ConflictError
from gpushare.kube.lean_client import KEEP_CONNECTIONS
from gpushare.kube.raw import RawApi


def config(user: dict[str, object], *, server: str = "http://127.0.0.1:6443") -> KubeConfig:
    return KubeConfig.from_dict(
        {
            "clusters": [{"name": "c", "cluster": {"server": server}}],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
    )


def raw_for(user: dict[str, object]) -> RawApi | None:
    single = config(user).get()
    assert single is not None
    return RawApi.from_config(single)


def test_a_rotated_service_account_token_is_picked_up_after_a_401(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    raw = raw_for({"tokenFile": str(token)})
    assert raw is not None
    assert raw._headers()["Authorization"] == "Bearer first"
    token.write_text("second\n")
    raw._forget_token()  # what a 401 answer does
    assert raw._headers()["Authorization"] == "Bearer second"


def test_a_static_token_is_sent_as_bearer() -> None:
    raw = raw_for({"token": "abc"})
    assert raw is not None and raw._headers()["Authorization"] == "Bearer abc"


def test_exec_and_basic_auth_stay_on_lightkube() -> None:
    assert raw_for({"exec": {"command": "get-token", "apiVersion": "v1"}}) is None
    assert raw_for({"username": "a", "password": "b"}) is None


MANAGED = [{"manager": "kube-scheduler", "operation": "Update", "fieldsV1": {"f:spec": {}}}]


def pod_json(name: str, version: str) -> dict[str, object]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "resourceVersion": version,
            "annotations": {"gpushare.io/gpu-fraction": "0.5"},
            "managedFields": MANAGED,
        },
        "spec": {"nodeName": "n1"},
    }


async def test_listed_and_watched_objects_come_without_managed_fields() -> None:
    """managedFields is read by nothing in gpushare and is most of a pod's dicts: the raw path
    drops it as it decodes (what the controller keeps costs its GC); the rest is untouched."""

    async def pods(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch"):
            resp = web.StreamResponse()
            await resp.prepare(request)
            event = {"type": "MODIFIED", "object": pod_json("b", "12")}
            await resp.write(json.dumps(event).encode() + b"\n")
            return resp
        if request.query.get("continue"):
            return web.json_response(
                {"metadata": {"resourceVersion": "11"}, "items": [pod_json("b", "11")]}
            )
        body = {
            "metadata": {"resourceVersion": "11", "continue": "x"},
            "items": [pod_json("a", "10")],
        }
        return web.json_response(body)

    app = web.Application()
    app.router.add_get("/api/v1/pods", pods)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    raw = RawApi(server=f"http://127.0.0.1:{port}", ssl=None, token=None, token_file=None)
    try:
        items, version = await raw.list("/api/v1/pods", what="list pods")
        watched = [
            obj
            async for _, obj in raw.watch(
                "/api/v1/pods", resource_version=version, timeout_seconds=5, what="watch pods"
            )
        ]
    finally:
        await raw.close()
        await runner.cleanup()
    assert version == "11"
    assert [o["metadata"]["name"] for o in [*items, *watched]] == ["a", "b", "b"]
    for obj in [*items, *watched]:
        assert "managedFields" not in obj["metadata"]
        assert obj["metadata"]["annotations"] == {"gpushare.io/gpu-fraction": "0.5"}
        assert obj["spec"] == {"nodeName": "n1"}


class ScriptedServer:
    """A loopback HTTP server answering each request with the next scripted bytes (the API
    server's framings: Content-Length, chunked, close-delimited), recording what it was sent
    and on which connection."""

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = answers
        self.requests: list[tuple[int, bytes]] = []
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            conn = self.connections
            try:
                while self.answers:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = int(
                        next(
                            line.split(b":")[1]
                            for line in head.split(b"\r\n")
                            if line.lower().startswith(b"content-length")
                        )
                    )
                    body = await reader.readexactly(length)
                    self.requests.append((conn, head + body))
                    answer = self.answers.pop(0)
                    writer.write(answer)
                    await writer.drain()
                    if b"Connection: close" in answer or (
                        b"Content-Length" not in answer and (b"chunked" not in answer)
                    ):
                        break
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/prefix"

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()


CREATED = b'{"kind":"Status","status":"Success","code":201}'


async def test_writes_reuse_one_connection_and_read_every_framing() -> None:
    """Bindings and patches go over kept connections: one for consecutive writes, every answer
    framing the API server uses is read, and a 409 comes back as the typed conflict."""
    chunked = b'{"metadata":{"name":"c"}}'
    server = ScriptedServer(
        [
            b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(CREATED) + CREATED,
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n" % 10
            + chunked[:10]
            + b"\r\n%x\r\n" % (len(chunked) - 10)
            + chunked[10:]
            + b"\r\n0\r\n\r\n",
            b"HTTP/1.1 409 Conflict\r\nContent-Length: 40\r\n\r\n"
            b'{"message":"pod p is already assigned"}\n',
            b"HTTP/1.1 200 OK\r\n\r\n{}",  # close-delimited
        ]
    )
    base = await server.start()
    raw = RawApi(server=base, ssl=None, token="abc", token_file=None)
    try:
        await raw.post("/api/v1/namespaces/ns/pods/p/binding", {"kind": "Binding"}, what="bind")
        patched = await raw.patch(
            "/apis/x/v1/c", {"a": 1}, patch_type="merge", field_manager="gpushare", what="patch"
        )
        with pytest.raises(ConflictError, match="already assigned"):
            await raw.post("/api/v1/namespaces/ns/pods/p/binding", {}, what="bind")
        assert await raw.patch("/x", {}, patch_type="json", field_manager="m", what="p") == {}
    finally:
        await raw.close()
        await server.stop()
    assert patched == {"metadata": {"name": "c"}}
    assert [conn for conn, _ in server.requests] == [1, 1, 1, 1]
    first, second = server.requests[0][1], server.requests[1][1]
    assert first.startswith(b"POST /prefix/api/v1/namespaces/ns/pods/p/binding HTTP/1.1\r\n")
    assert b"Authorization: Bearer abc\r\n" in first and first.endswith(b'{"kind":"Binding"}')
    assert second.startswith(b"PATCH /prefix/apis/x/v1/c?fieldManager=gpushare HTTP/1.1")
    assert b"Content-Type: application/merge-patch+json" in second


async def test_a_connection_the_server_closed_is_not_reused_and_bad_answers_fail_cleanly() -> None:
    server = ScriptedServer(
        [
            b"HTTP/1.1 201 Created\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
            b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}",
            b"garbage\r\n\r\n",
        ]
    )
    base = await server.start()
    raw = RawApi(server=base, ssl=None, token=None, token_file=None)
    try:
        await raw.post("/a", {}, what="first")
        await raw.post("/a", {}, what="second")  # a new connection: the first was closed
        with pytest.raises(OSError, match=r"not an HTTP/1\.x answer"):
            await raw.post("/a", {}, what="third")
    finally:
        await raw.close()
        await server.stop()
    assert [conn for conn, _ in server.requests] == [1, 2, 2]


async def test_a_burst_of_writes_keeps_its_connections_for_the_next_burst() -> None:
    """Writes in flight at once each take a connection (HTTP/1.1, as the DRA allocator's
    placements do, up to its MAX_WRITES pods); the ones a burst opened are kept for the next
    burst instead of closed and opened again, a TLS handshake each against a real API server
    (KEEP_CONNECTIONS: docs/scale.md)."""
    burst = MAX_WRITES
    assert burst <= KEEP_CONNECTIONS
    opened = 0
    waiting = 0
    release = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal opened, waiting
        opened += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                waiting += 1
                if waiting == burst:  # every write of the burst is in flight: answer them
                    release.set()
                await release.wait()
                writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    raw = RawApi(server=base, ssl=None, token=None, token_file=None)
    try:
        for _ in range(2):
            waiting, release = 0, asyncio.Event()
            await asyncio.wait_for(
                asyncio.gather(*(raw.post(f"/b/{i}", {}, what="bind") for i in range(burst))),
                timeout=10,
            )
    finally:
        await raw.close()
        server.close()
    assert opened == burst  # the second burst opened none
