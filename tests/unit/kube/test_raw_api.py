"""The controller's raw API path (watches and Bindings without lightkube's models): which
kubeconfigs it serves and how it authenticates."""

import json
from pathlib import Path

from aiohttp import web
from lightkube.config.kubeconfig import KubeConfig

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
