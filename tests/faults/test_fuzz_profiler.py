"""Property-based fuzzing of the node agent's HTTP endpoint as the agent serves it (its
MetricsServer with the exporter wired in: /profile, /metrics, /healthz; simulated GPUs): any
query string or path gets a 2xx, a 4xx naming the parameter and the fix, or a 503 asking to
retry, and the server keeps serving. (tests/fuzz/ covers the extender and the webhook.)"""

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gpushare.node.extension import wire_exporter
from gpushare.node.gpu.simulated import SimulatedBackend
from gpushare.node.metrics import MetricsServer
from gpushare.node.mps.manager import MpsManager

FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def agent_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    backend = SimulatedBackend("2xH200", node_name="fuzz")
    registry = CollectorRegistry()
    server = MetricsServer(registry=registry, host="127.0.0.1", port=0)
    mps = MpsManager(root=Path(tmp_path_factory.mktemp("mps")), simulated=True)
    handle = wire_exporter(
        registry=registry,
        server=server,
        backend=backend,
        node_name="fuzz",
        pods=list,
        mps=mps,
        pod_resources_socket=None,
    )
    assert handle is not None
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}", backend.inventory()[0].uuid
    finally:
        handle.stop()
        server.stop()


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def still_serving(base: str) -> bool:
    return get(f"{base}/healthz")[0] == 200


params = st.dictionaries(
    st.sampled_from(["gpu", "window", "node", "pipe", ""]) | st.text(max_size=6),
    st.sampled_from(["0", "1", "7", "-1", "1e9", "nan", "inf", "5", "", "GPU-x"])
    | st.text(max_size=12)
    | st.integers(-(10**12), 10**12).map(str),
    max_size=4,
)


@FUZZ
@given(query=params, repeat=st.booleans())
def test_any_profile_query_gets_an_answer_or_a_4xx_naming_the_parameter(
    agent_http: tuple[str, str], query: dict[str, str], repeat: bool
) -> None:
    base, _ = agent_http
    pairs = list(query.items())
    if repeat and pairs:
        pairs.append(pairs[0])
    status, body = get(f"{base}/profile?{urllib.parse.urlencode(pairs)}")
    assert status in (200, 400, 404, 503), (status, body)
    doc = json.loads(body)
    if status != 200:
        # The parameter it names (empty only when the query had a parameter without a name).
        assert doc["fix"] and doc["error"].startswith(f"{doc['field']}:"), doc
        assert doc["field"] or "" in query, doc
    else:
        assert doc["gpu_uuid"].startswith("GPU-")
    assert still_serving(base)


@FUZZ
@given(raw=st.binary(max_size=60))
def test_raw_bytes_in_the_path_and_query_never_break_the_server(
    agent_http: tuple[str, str], raw: bytes
) -> None:
    base, _ = agent_http
    quoted = urllib.parse.quote_from_bytes(raw, safe="/?&=")
    status, _ = get(f"{base}/{quoted}")
    assert status < 500 or status == 503, status
    status, _ = get(f"{base}/profile?{quoted}")
    assert status < 500 or status == 503, status
    assert still_serving(base)
