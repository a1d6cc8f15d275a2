"""Security posture without a cluster: the controller's webhook and extender speak only TLS when
configured so (a plain-HTTP client or one that does not trust the CA gets nothing), and in the
rendered chart no container is privileged but the node agent on real GPUs.

The per-ServiceAccount RBAC matrix (kubectl auth can-i against the real API server) is
tests/cluster/test_chart_e2e.py::test_service_accounts_can_do_exactly_what_they_need.
"""

import asyncio
import json
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushare.cluster.main import ControllerContext, serve
from gpushare.cluster.metrics import Metrics
from gpushare.cluster.settings import Settings
from gpushare.cluster.state.view import ClusterView
from gpushare.cluster.tls import ensure_certs
from tests.fixtures.builders import gpu, node_json
from tests.fixtures.helm_chart import Chart


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def tls_controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, Path]]:
    """The controller's serving code (no API server) with TLS on both listeners."""
    certs = tmp_path_factory.mktemp("certs")
    files = ensure_certs(certs, hosts=["127.0.0.1", "localhost"])
    settings = Settings.of(
        extender_port=free_port(),
        extender_tls_cert=files.cert,
        extender_tls_key=files.key,
        webhook_port=free_port(),
        webhook_cert_dir=certs,
        operator_enabled=False,
    )
    view = ClusterView()
    view.replace_nodes([node_json("n0", [gpu("G0")])])
    view.replace_pods([])
    ctx = ControllerContext(settings=settings, view=view, metrics=Metrics(view), kube=None)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(ctx),), daemon=True)
    thread.start()
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", settings.webhook_port), timeout=0.2).close()
            socket.create_connection(("127.0.0.1", settings.extender_port), timeout=0.2).close()
            break
        except OSError:
            threading.Event().wait(0.05)
    try:
        yield settings, files.ca
    finally:
        loop.call_soon_threadsafe(ctx.stopping.set)
        thread.join(timeout=10)


def post(url: str, body: dict[str, Any], *, ca: Path | None) -> int:
    context = ssl.create_default_context(cafile=str(ca)) if ca else ssl.create_default_context()
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5, context=context) as resp:
        return int(resp.status)


FILTER = {"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["n0"]}


@pytest.mark.parametrize("listener", ["extender", "webhook"])
def test_listener_answers_only_tls_clients_that_trust_its_ca(
    tls_controller: tuple[Settings, Path], listener: str
) -> None:
    settings, ca = tls_controller
    port = settings.extender_port if listener == "extender" else settings.webhook_port
    path = "/scheduler/filter" if listener == "extender" else "/healthz"
    if listener == "extender":
        assert post(f"https://127.0.0.1:{port}{path}", FILTER, ca=ca) == 200
    else:
        context = ssl.create_default_context(cafile=str(ca))
        with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=context) as r:
            assert r.status == 200
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5)  # plain HTTP
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        post(f"https://127.0.0.1:{port}{path}", FILTER, ca=None)  # does not trust our CA


WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "Pod")


def containers(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    spec = obj["spec"]
    pod = spec.get("template", {}).get("spec") or spec.get("jobTemplate", {}) or spec
    return [
        (f"{obj['kind']}/{obj['metadata']['name']}/{c['name']}", pod, c)
        for c in [*pod.get("initContainers", []), *pod.get("containers", [])]
    ]


@pytest.mark.parametrize("backend", ["nvml", "simulated:2xH100-80GB"])
def test_only_the_node_agent_on_real_gpus_runs_privileged(chart: Chart, backend: str) -> None:
    rendered = chart.render({"node": {"backend": backend}})
    seen = []
    for obj in rendered.objects:
        if obj.get("kind") not in WORKLOADS:
            continue
        for where, pod, c in containers(obj):
            seen.append(where)
            sc = c.get("securityContext") or {}
            # The node agent and the MPS daemons' launcher (docs/node-agent.md, "MPS daemons").
            agent = where.startswith("DaemonSet/") and (
                "node-agent" in where or where.endswith("-mps-daemons/mps-launcher")
            )
            assert not pod.get("hostNetwork"), f"{where} uses the host network"
            if sc.get("privileged"):
                assert agent and backend == "nvml", f"{where} is privileged"
                continue
            assert sc.get("allowPrivilegeEscalation") is False, where
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], where
            assert not sc.get("capabilities", {}).get("add"), where
            if not agent:
                assert pod.get("hostPID") is not True, f"{where} shares the host PID namespace"
                run_as_root = (
                    sc.get("runAsUser") or pod.get("securityContext", {}).get("runAsUser")
                ) == 0
                assert not run_as_root, f"{where} runs as root"
    assert any("node-agent" in w for w in seen) and any("controller" in w for w in seen), seen
