"""The extender over real HTTP: verbs at kube-scheduler's paths, 4xx with a reason for bad
bodies, health and metrics endpoints."""

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.metrics import Metrics
from gpushare.cluster.server import extender_app
from gpushare.cluster.state.view import ClusterView
from tests.fixtures.builders import gpu, node_json, pod_json

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(loop_scope="session")
async def client() -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    view = ClusterView()
    view.replace_nodes([node_json("n1", [gpu("G0")]), node_json("n2", None)])
    view.replace_pods([])
    metrics = Metrics(view)
    app = extender_app(
        Extender(view=view, writer=None), metrics=metrics, ready=lambda: (view.synced, "test")
    )
    async with TestClient(TestServer(app)) as c:
        yield c


async def test_filter_over_http(client: TestClient) -> None:  # type: ignore[type-arg]
    body = {"Pod": pod_json("p", fraction="0.25"), "NodeNames": ["n1", "n2"], "Nodes": None}
    resp = await client.post("/scheduler/filter", json=body)
    assert resp.status == 200
    result = await resp.json()
    assert result["NodeNames"] == ["n1"]
    assert list(result["FailedAndUnresolvableNodes"]) == ["n2"]


async def test_prioritize_over_http(client: TestClient) -> None:  # type: ignore[type-arg]
    body = {"Pod": pod_json("p", fraction="0.25"), "NodeNames": ["n1", "n2"]}
    resp = await client.post("/scheduler/prioritize", json=body)
    assert resp.status == 200
    assert [h["Host"] for h in await resp.json()] == ["n1", "n2"]


async def test_bad_bodies_get_400_with_the_reason(client: TestClient) -> None:  # type: ignore[type-arg]
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


async def test_bind_without_api_access_reports_an_error(client: TestClient) -> None:  # type: ignore[type-arg]
    body = {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "n1"}
    resp = await client.post("/scheduler/bind", json=body)
    assert resp.status == 200
    assert "cannot bind" in (await resp.json())["Error"]


async def test_metrics_expose_per_verb_latency(client: TestClient) -> None:  # type: ignore[type-arg]
    await client.post("/scheduler/filter", json={"Pod": pod_json("p"), "NodeNames": ["n1"]})
    await client.post("/scheduler/filter", data=b"[]")
    text = await (await client.get("/metrics")).text()
    assert 'gpushare_extender_request_duration_seconds_count{verb="filter"} 2.0' in text
    assert 'gpushare_extender_requests_total{outcome="bad_request",verb="filter"} 1.0' in text
    assert "gpushare_controller_gpus 1.0" in text


async def test_readyz_reflects_the_view_sync(client: TestClient) -> None:  # type: ignore[type-arg]
    assert (await client.get("/readyz")).status == 200
