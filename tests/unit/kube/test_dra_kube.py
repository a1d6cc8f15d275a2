"""The DRA plugin's API calls as the API server receives them (a loopback HTTP server)."""

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from lightkube import Client, KubeConfig

from gpushare.kube.dra import DraKube

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


class Recorder(BaseHTTPRequestHandler):
    requests: list[tuple[str, str, dict[str, list[str]], Any]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> tuple[str, Any]:
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.requests.append((self.command, url.path, parse_qs(url.query), body))
        return url.path, body

    def do_GET(self) -> None:
        path, _ = self._record()
        if path == SLICES:
            self._answer(200, {"kind": "ResourceSliceList", "metadata": {}, "items": []})
        elif path.endswith("/resourceclaims/c1"):
            self._answer(200, {"kind": "ResourceClaim", "metadata": {"name": "c1", "uid": "u"}})
        else:
            self._answer(404, {"kind": "Status", "code": 404, "reason": "NotFound"})

    def do_PUT(self) -> None:
        _, body = self._record()
        self._answer(200, body)

    def do_DELETE(self) -> None:
        self._record()
        self._answer(404, {"kind": "Status", "code": 404, "reason": "NotFound"})

    def do_POST(self) -> None:
        _, body = self._record()
        self._answer(201, {**body, "metadata": {**body["metadata"], "resourceVersion": "7"}})


@pytest.fixture
def dra() -> Iterator[DraKube]:
    Recorder.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = KubeConfig.from_dict(
        {
            "clusters": [
                {"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}
            ],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
    )
    client = Client(config=config)
    try:
        yield DraKube(client=client, node_name="n1")
    finally:
        client.close()
        server.shutdown()


def test_a_claim_is_read_from_its_namespace_and_a_missing_one_is_none(dra: DraKube) -> None:
    claim = dra.get_claim(namespace="ns", name="c1")
    assert claim is not None and claim["metadata"]["uid"] == "u"
    assert dra.get_claim(namespace="ns", name="gone") is None
    assert Recorder.requests[0][1] == "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c1"


def test_slices_are_listed_by_node_and_driver_and_created_as_written(dra: DraKube) -> None:
    assert dra.list_slices() == []
    _, _, query, _ = Recorder.requests[0]
    assert set(query["fieldSelector"][0].split(",")) == {
        "spec.nodeName=n1",
        "spec.driver=gpu.gpushare.io",
    }
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "n1-gpu.gpushare.io"},
        "spec": {"devices": [{"name": "gpu-0", "allowMultipleAllocations": True}]},
    }
    stored = dra.create_slice(body)
    method, path, _, sent = Recorder.requests[-1]
    assert (method, path) == ("POST", SLICES)
    assert sent["spec"] == body["spec"]
    assert stored["metadata"]["resourceVersion"] == "7"


def test_a_slice_is_replaced_by_name_and_deleting_a_gone_one_is_fine(dra: DraKube) -> None:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "n1-gpu.gpushare.io", "resourceVersion": "7"},
        "spec": {"devices": []},
    }
    dra.replace_slice(body)
    dra.delete_slice("old")
    assert [(m, p) for m, p, _, _ in Recorder.requests] == [
        ("PUT", f"{SLICES}/n1-gpu.gpushare.io"),
        ("DELETE", f"{SLICES}/old"),
    ]
    assert Recorder.requests[0][3]["metadata"]["resourceVersion"] == "7"
