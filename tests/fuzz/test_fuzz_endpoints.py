"""Property-based fuzzing of the extender and webhook endpoints over real HTTP: whatever the
body, the answer is a 2xx in the exact shape or a 4xx with a reason, and the server keeps
serving."""

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare.api.names import (
    ANN_CLASS,
    ANN_CONTAINER,
    ANN_FRACTION,
    ANN_GPU_UUID,
    ANN_MEMORY,
    ANN_SHARE,
    RESOURCE_GPU_PERCENT,
)
from gpushare.cluster.context import ControllerContext
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.metrics import Metrics
from gpushare.cluster.server import extender_routes
from gpushare.cluster.settings import Settings
from gpushare.cluster.state.view import ClusterView
from tests.fixtures.admission import ServedAdmission
from tests.fixtures.builders import gpu, node_json, pod_json
from tests.fixtures.threaded_listener import ThreadedListener

NODES = ["n0", "n1", "n2"]


@dataclass
class Servers:
    extender: str
    webhook: str


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    """Both apps on loopback ports, served from a thread: one server for every example."""
    view = ClusterView()
    view.replace_nodes(
        [node_json("n0", [gpu("G0"), gpu("G1", index=1)]), node_json("n1", [gpu("G2")])]
    )
    view.replace_pods([pod_json("t", fraction="0.5", node="n0")])
    metrics = Metrics(view)
    view.mark_synced()
    ctx = ControllerContext(settings=Settings(), view=view, metrics=metrics, kube=None)
    admission = ServedAdmission(ctx)
    extender = ThreadedListener(
        extender_routes(Extender(view=view, writer=None), metrics=metrics, ready=lambda: (True, ""))
    )
    try:
        yield Servers(f"http://127.0.0.1:{extender.port}", f"http://127.0.0.1:{admission.port}")
    finally:
        extender.close()
        admission.close()


def post(url: str, body: bytes) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method="POST")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def healthy(base: str) -> bool:
    with urllib.request.urlopen(f"{base}/healthz", timeout=5) as resp:
        return resp.status == 200


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
quantity_text = st.one_of(
    st.sampled_from(
        ["0.25", "25%", "1", "2", "0", "-1", "1.5", "101%", "1e3", "", " ", "NaN", "inf"]
    ),
    st.text(max_size=8),
    st.integers(-(10**6), 10**6).map(str),
)
annotations = st.dictionaries(
    st.sampled_from(
        [ANN_FRACTION, ANN_MEMORY, ANN_CLASS, ANN_SHARE, ANN_CONTAINER, ANN_GPU_UUID, "x/y"]
    ),
    quantity_text | json_values,
    max_size=4,
)
containers = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "name": st.text(max_size=6) | json_values,
            "env": st.lists(
                st.fixed_dictionaries(
                    {
                        "name": st.sampled_from(["CUDA_MPS_X", "A", "CUDA_VISIBLE_DEVICES"])
                        | json_values
                    }
                ),
                max_size=2,
            )
            | json_values,
            "resources": st.fixed_dictionaries(
                {},
                optional={
                    "limits": st.dictionaries(
                        st.sampled_from([RESOURCE_GPU_PERCENT, "nvidia.com/gpu", "cpu"]),
                        quantity_text | json_values,
                        max_size=2,
                    )
                    | json_values,
                    "requests": json_values,
                },
            )
            | json_values,
        },
    ),
    max_size=3,
)
pods = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries(
            {"name": st.text(min_size=1, max_size=8)},
            optional={
                "namespace": st.text(max_size=5),
                "annotations": annotations,
                "uid": json_values,
            },
        )
    },
    optional={
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "containers": containers | json_values,
                "volumes": st.lists(
                    st.fixed_dictionaries(
                        {"hostPath": st.fixed_dictionaries({"path": st.text(max_size=10)})}
                    ),
                    max_size=2,
                )
                | json_values,
                "nodeName": json_values,
                "schedulerName": json_values,
            },
        ),
        "status": st.fixed_dictionaries({}, optional={"phase": json_values}),
    },
)
extender_args = st.one_of(
    st.fixed_dictionaries(
        {
            "Pod": pods,
            "NodeNames": st.lists(st.sampled_from(NODES) | st.text(max_size=4), max_size=5),
        }
    ),
    st.fixed_dictionaries(
        {}, optional={"Pod": pods | json_values, "NodeNames": json_values, "Nodes": json_values}
    ),
    json_values,
)
FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def check_reason(status: int, body: bytes) -> None:
    assert status < 500, body
    if status >= 400:
        assert status == 400
        assert b"gpushare" in body and len(body) > 20, body


@FUZZ
@given(body=st.binary(max_size=200))
def test_any_bytes_get_a_4xx_with_a_reason(servers: Servers, body: bytes) -> None:
    for path in ("/scheduler/filter", "/scheduler/prioritize", "/scheduler/bind"):
        check_reason(*post(servers.extender + path, body))
    for path in ("/mutate", "/validate"):
        check_reason(*post(servers.webhook + path, body))
    assert healthy(servers.extender) and healthy(servers.webhook)


@FUZZ
@given(doc=extender_args)
def test_filter_answers_every_candidate_exactly_once_or_refuses(servers: Servers, doc: Any) -> None:
    status, body = post(servers.extender + "/scheduler/filter", json.dumps(doc).encode())
    check_reason(status, body)
    if status == 200:
        result = json.loads(body)
        assert set(result) == {
            "Nodes",
            "NodeNames",
            "FailedNodes",
            "FailedAndUnresolvableNodes",
            "Error",
        }
        names = (
            doc["NodeNames"]
            if doc.get("NodeNames") is not None
            else [n["metadata"]["name"] for n in doc["Nodes"]["items"]]
        )
        passed = (
            result["NodeNames"]
            if result["NodeNames"] is not None
            else [n["metadata"]["name"] for n in result["Nodes"]["items"]]
        )
        answered = [*passed, *result["FailedNodes"], *result["FailedAndUnresolvableNodes"]]
        assert sorted(answered) == sorted(set(names)) or sorted(answered) == sorted(names)
        assert not any("%" in m for m in result["FailedNodes"].values())
    status, body = post(servers.extender + "/scheduler/prioritize", json.dumps(doc).encode())
    check_reason(status, body)
    if status == 200:
        assert all(0 <= h["Score"] <= 10 and set(h) == {"Host", "Score"} for h in json.loads(body))


@FUZZ
@given(
    doc=st.fixed_dictionaries(
        {
            "PodName": st.text(max_size=5) | json_values,
            "PodNamespace": st.text(max_size=5) | json_values,
            "PodUID": st.text(max_size=5) | json_values,
            "Node": st.text(max_size=5) | json_values,
        }
    )
    | json_values
)
def test_bind_refuses_or_answers_with_an_error_field(servers: Servers, doc: Any) -> None:
    status, body = post(servers.extender + "/scheduler/bind", json.dumps(doc).encode())
    check_reason(status, body)
    if status == 200:
        assert set(json.loads(body)) == {"Error"}


@FUZZ
@given(pod=pods | json_values, op=st.sampled_from(["CREATE", "UPDATE", "DELETE"]), kind=json_values)
def test_webhook_answers_every_review_with_its_uid(
    servers: Servers, pod: Any, op: str, kind: Any
) -> None:
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "fuzz-1",
            "kind": {"kind": "Pod"} if kind is None else kind,
            "operation": op,
            "namespace": "default",
            "object": pod,
        },
    }
    for path in ("/mutate", "/validate"):
        status, body = post(servers.webhook + path, json.dumps(review).encode())
        check_reason(status, body)
        if status == 200:
            response = json.loads(body)["response"]
            assert response["uid"] == "fuzz-1"
            assert isinstance(response["allowed"], bool)
            if not response["allowed"]:
                assert response["status"]["message"].startswith("gpushare: ")
