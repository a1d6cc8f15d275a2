"""The extender over real HTTP: verbs at kube-scheduler's paths, 4xx with a reason for bad
bodies, health and metrics endpoints."""

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import ClientSession

from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.metrics import Metrics
from gpushare.cluster.server import Listener, extender_routes
from gpushare.cluster.state.view import ClusterView
from tests.fixtures.builders import gpu, node_json, pod_json

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Client:
    """Requests to the extender's port as kube-scheduler, the kubelet and Prometheus send them."""

    def __init__(self, session: ClientSession, base: str) -> None:
        self.session, self.base = session, base

    def post(self, path: str, **kw: Any) -> Any:
        return self.session.post(self.base + path, **kw)

    def get(self, path: str) -> Any:
        return self.session.get(self.base + path)


@pytest_asyncio.fixture(loop_scope="session")
async def client() -> AsyncIterator[Client]:
    view = ClusterView()
    view.replace_nodes([node_json("n1", [gpu("G0")]), node_json("n2", None)])
    view.replace_pods([])
    metrics = Metrics(view)
    routes = extender_routes(
        Extender(view=view, writer=None), metrics=metrics, ready=lambda: (view.synced, "test")
    )
    listener = Listener(routes, host="127.0.0.1", port=0, ssl_context=None)
    await listener.start()
    try:
        async with ClientSession() as session:
            yield Client(session, f"http://127.0.0.1:{listener.bound_port}")
    finally:
        await listener.stop()


async def test_filter_over_http(client: Client) -> None:
    body = {"Pod": pod_json("p", fraction="0.25"), "NodeNames": ["n1", "n2"], "Nodes": None}
    resp = await client.post("/scheduler/filter", json=body)
    assert resp.status == 200
    result = await resp.json()
    assert result["NodeNames"] == ["n1"]
    assert list(result["FailedAndUnresolvableNodes"]) == ["n2"]


async def test_prioritize_over_http(client: Client) -> None:
    body = {"Pod": pod_json("p", fraction="0.25"), "NodeNames": ["n1", "n2"]}
    resp = await client.post("/scheduler/prioritize", json=body)
    assert resp.status == 200
    assert [h["Host"] for h in await resp.json()] == ["n1", "n2"]


async def test_bad_bodies_get_400_with_the_reason(client: Client) -> None:
    resp = await client.post("/scheduler/filter", data=b"{not json")
    assert resp.status == 400
    assert "not JSON" in (await resp.json())["Error"]
    resp = await client.post("/scheduler/filter", json={"Pod": {}, "NodeNames": ["n1"]})
    assert resp.status == 400
    assert "Pod.metadata.name" in (await resp.json())["Error"]
    resp = await client.post("/scheduler/bind", json={"PodName": "p"})
    assert resp.status == 400
    assert "PodNamespace" in (await resp.json())["Error"]
    resp = await client.post("/scheduler/filter", data=b'"\x80"')  # a string, not UTF-8
    assert resp.status == 400
    assert "not valid UTF-8" in (await resp.json())["Error"]
    # ... and the server still answers.
    resp = await client.get("/healthz")
    assert resp.status == 200


async def test_bind_without_api_access_reports_an_error(client: Client) -> None:
    body = {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "n1"}
    resp = await client.post("/scheduler/bind", json=body)
    assert resp.status == 200
    assert "cannot bind" in (await resp.json())["Error"]


async def test_metrics_expose_per_verb_latency(client: Client) -> None:
    await client.post("/scheduler/filter", json={"Pod": pod_json("p"), "NodeNames": ["n1"]})
    await client.post("/scheduler/filter", data=b"[]")
    text = await (await client.get("/metrics")).text()
    assert 'gpushare_extender_request_duration_seconds_count{verb="filter"} 2.0' in text
    assert 'gpushare_extender_requests_total{outcome="bad_request",verb="filter"} 1.0' in text
    assert "gpushare_controller_gpus 1.0" in text


async def test_readyz_reflects_the_view_sync(client: Client) -> None:
    assert (await client.get("/readyz")).status == 200
