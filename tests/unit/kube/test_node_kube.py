"""The node agent reads only its own node's pods (issue #45: its ServiceAccount read every pod
spec in the cluster): every pod read is a list or a watch (the pause loop's wake-up, issue 65)
with the field selector spec.nodeName=<node>, and it never gets a pod (the chart's role grants
pods list, watch and patch only, tests/chart/test_node_rbac.py). Requests as the API server
receives them (a loopback server)."""

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from gpushare.api.pod import pod_info
from gpushare.kube.node import NodeKube

MINE = {
    "metadata": {"name": "mine", "namespace": "a", "uid": "u1"},
    "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
}


class ApiServer(BaseHTTPRequestHandler):
    requests: list[tuple[str, str, dict[str, list[str]]]] = []
    bodies: list[bytes] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> str:
        url = urlparse(self.path)
        self.requests.append((self.command, url.path, parse_qs(url.query)))
        length = int(self.headers.get("Content-Length") or 0)
        self.bodies.append(self.rfile.read(length))
        return url.path

    def do_GET(self) -> None:
        self._record()
        if "watch=true" in self.path:
            pod = {"kind": "Pod", "apiVersion": "v1", **MINE}
            line = json.dumps({"type": "ADDED", "object": pod}).encode() + b"\n"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(line)))
            self.end_headers()
            self.wfile.write(line)
            return
        self._answer({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [MINE]})

    def do_PATCH(self) -> None:
        self._record()
        self._answer({"kind": "Pod", "apiVersion": "v1", **MINE})


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[NodeKube[Any]]:
    ApiServer.requests = []
    ApiServer.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), ApiServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}
        ],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    node = NodeKube(node_name="n1", project=pod_info, kubeconfig=path)
    try:
        yield node
    finally:
        node.close()
        server.shutdown()


def test_the_agent_lists_only_its_nodes_pods_and_never_gets_one(
    kube: NodeKube[Any],
) -> None:
    assert [p["metadata"]["name"] for p in kube.raw_node_pods()] == ["mine"]
    assert [p.name for p in kube.list_node_pods()] == ["mine"]
    kube.cached_node_pods(max_age_s=0)
    pod = kube.list_node_pods()[0]
    kube.mark_allocated(pod)
    reads = [(m, path, q) for m, path, q in ApiServer.requests if "/pods" in path and m == "GET"]
    assert len(reads) == 4
    for _, path, query in reads:
        assert path == "/api/v1/pods"  # a list, never a GET of one pod
        assert query["fieldSelector"] == ["spec.nodeName=n1"]
        assert "watch" not in query
    patch = [(m, path) for m, path, _ in ApiServer.requests if m == "PATCH"]
    assert patch == [("PATCH", "/api/v1/namespaces/a/pods/mine")]


def test_the_pause_loops_watch_and_annotation_stay_on_its_own_nodes_pods(
    kube: NodeKube[Any],
) -> None:
    """The watch that wakes the pause loop carries the same field selector as the lists; the
    pause record is a patch that names the pod's UID (a pod of the same name created since is
    left alone: the API server refuses a patch that changes a UID)."""
    watch = kube.watch_node_pods(timeout_s=5)
    event, manifest = next(watch)
    watch.close()
    assert (event, manifest["metadata"]["name"]) == ("ADDED", "mine")
    watches = [q for m, path, q in ApiServer.requests if m == "GET" and "watch" in q]
    assert watches and all(path == "/api/v1/pods" for m, path, q in ApiServer.requests)
    assert watches[0]["fieldSelector"] == ["spec.nodeName=n1"]
    pod = kube.list_node_pods()[0]
    kube.set_pod_annotation(pod=pod, key="gpushare.io/paused", value=None)
    assert json.loads(ApiServer.bodies[-1]) == {
        "metadata": {"uid": "u1", "annotations": {"gpushare.io/paused": None}}
    }
    assert [(m, path) for m, path, _ in ApiServer.requests if m == "PATCH"] == [
        ("PATCH", "/api/v1/namespaces/a/pods/mine")
    ]
