"""`kubectl gpushare top`: what a user sees for nodes, GPUs and the pods sharing them."""

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo
from gpushare.cli.live import from_exporters, from_prometheus, read_token
from gpushare.cli.main import main
from gpushare.cli.render import GiB, memory_limit, render_json, render_text
from gpushare.cli.view import build_view
from gpushare.kube.access import Access
from gpushare.kube.access import _missing as missing_token
from gpushare.kube.cli import ALL_NAMESPACES, Snapshot
from gpushare.node.exporter import SamplerSettings, build_exporter
from gpushare.node.exporter.server import serve
from gpushare.node.gpu.simulated import SimulatedBackend
from gpushare.node.metrics import MetricsServer
from tests.fixtures.builders import GPU_A, GPU_B, NODES
from tests.fixtures.builders import cli_node as node
from tests.fixtures.builders import placed_pod as pod
from tests.unit.cluster.dra.helpers import GIB, allocated_claim, mps_config, node_slice

PODS = [
    pod("ml", "small", GPU_A, "0.25", 25),
    pod("web", "infer", GPU_A, "50%", 70),
    pod("ml", "big", f"{GPU_A},{GPU_B}", "2", 100),
    pod("ml", "done", GPU_B, "0.5", 50, phase="Succeeded"),
    {"metadata": {"namespace": "ml", "name": "plain"}, "spec": {"nodeName": "node-a"}},
]


def test_pods_are_listed_under_the_gpus_they_share() -> None:
    view = build_view(NODES, PODS)
    assert [n.name for n in view] == ["node-a"]
    gpu_a, gpu_b = view[0].gpus
    assert [(p.name, p.fraction_percent, p.thread_percent) for p in gpu_a.pods] == [
        ("big", 100, 100),
        ("small", 25, 25),
        ("infer", 50, 70),
    ]
    assert gpu_a.allocated_percent == 175
    assert gpu_a.limit_percent == 195
    assert [p.name for p in gpu_b.pods] == ["big"]
    text = render_text(view, live_source=None)
    assert "GPU 0  NVIDIA H100 80GB HBM3" in text
    assert "allocated 175%  limits 195%" in text
    assert "REQUEST" in text and "LIMIT" in text
    assert "infer" in text and "70%" in text and "20.0Gi" in text
    # One unit for every memory cap, whether stated or a share of the GPU (issue 68).
    assert memory_limit(20 * GiB) == "20.0Gi" and memory_limit(20879104 * 1024) == "19.9Gi"
    assert "add --prometheus URL or --metrics-url URL" in text


def test_a_share_governed_pod_shows_the_request_the_scheduler_recorded() -> None:
    governed = pod("ml", "worker", GPU_B, "0.3", 100)
    del governed["metadata"]["annotations"]["gpushare.io/gpu-fraction"]
    governed["metadata"]["annotations"]["gpushare.io/request-percentage"] = "30"
    view = build_view(NODES, [governed])
    (row,) = view[0].gpus[1].pods
    assert (row.fraction_percent, row.thread_percent) == (30, 100)
    assert "30%" in render_text(view, live_source=None)


HOSTILE = "H100\x1b]0;owned\x07\x1b[2J\u202eevil\x9b31m\nfake row"


@pytest.mark.parametrize("command", [["top"], ["top", "-o", "wide"], ["get", "gpus", "-o", "wide"]])
def test_control_characters_from_the_cluster_are_printed_as_escapes(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #45: a node's GPU model (written by whoever may annotate nodes) and a pod's name
    reached the terminal raw; an escape sequence could clear the screen or retitle it, a newline
    forge a row."""
    gpus = [GpuInfo(GPU_A, 0, HOSTILE, 80 * 2**30, 132, "9.0")]
    nodes = [node("node-\x1b[31mred", gpus)]
    pods = [pod("ml", "p\x1b[8m", GPU_A, "0.25", 25)]
    for p in pods:
        p["spec"]["nodeName"] = "node-\x1b[31mred"

    def read(_: Any) -> Snapshot:
        return Snapshot(nodes=nodes, pods=pods, namespace=ALL_NAMESPACES)

    assert main([*command], read=read) == 0
    out = capsys.readouterr().out
    assert not [c for c in out if not c.isprintable() and c != "\n"], repr(out)
    assert "\\x1b]0;owned\\x07" in out and "\\u202e" in out and "\\nfake row" in out
    assert "fake row" not in out.replace("\\nfake row", "")


def test_namespace_filter_keeps_only_that_namespace() -> None:
    view = build_view(NODES, PODS, namespace="web")
    assert [p.name for g in view[0].gpus for p in g.pods] == ["infer"]


def test_node_without_inventory_is_explained_when_asked_for() -> None:
    view = build_view(NODES, PODS, node_filter="cpu-only")
    assert view[0].problem == "no gpushare.io/gpus annotation and no gpushare ResourceSlice"


def _reserved(claim: dict[str, Any], pod_name: str) -> dict[str, Any]:
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": pod_name, "uid": "u"}]
    return claim


def test_dra_nodes_show_their_slice_gpus_and_the_pods_their_claims_are_reserved_for() -> None:
    dra_node = {"metadata": {"name": "n1"}, "status": {}}
    slices = [node_slice("n1", 2)]
    claims = [
        _reserved(
            allocated_claim(
                "train-gpu", namespace="ml", pool="n1", device="gpu-0",
                consumed={"gpuPercent": "25"}, config=mps_config(limit=60),
            ),
            "train",
        ),
        _reserved(
            allocated_claim(
                "serve-gpu", namespace="web", pool="n1", device="gpu-0",
                consumed={"gpuPercent": "50", "memory": "8Gi"},
                config=mps_config(**{"class": "latency"}),
            ),
            "serve",
        ),
        _reserved(  # its pod finished: not shown
            allocated_claim("old-gpu", namespace="ml", pool="n1", device="gpu-1",
                            consumed={"gpuPercent": "30"}),
            "old",
        ),
        allocated_claim("nobody-gpu", namespace="ml", pool="n1", device="gpu-1"),  # no pod
    ]  # fmt: skip
    pods = [
        {"metadata": {"namespace": "ml", "name": "train"}, "status": {"phase": "Running"}},
        {"metadata": {"namespace": "web", "name": "serve"}, "status": {"phase": "Running"}},
        {"metadata": {"namespace": "ml", "name": "old"}, "status": {"phase": "Succeeded"}},
    ]
    view = build_view([*NODES, dra_node], pods, slices=slices, claims=claims)
    assert [n.name for n in view] == ["n1", "node-a"]
    gpu0, gpu1 = view[0].gpus
    assert (gpu0.info.uuid, gpu1.info.uuid) == ("n1-GPU-0", "n1-GPU-1")
    rows = [
        (p.namespace, p.name, p.gpu_class, p.fraction_percent, p.thread_percent, p.state)
        for p in gpu0.pods
    ]
    assert rows == [
        ("ml", "train", "batch", 25, 60, "claim"),
        ("web", "serve", "latency", 50, 100, "claim"),
    ]
    assert gpu0.pods[1].memory_limit_bytes == 8 * GIB
    assert gpu0.pods[0].memory_limit_bytes == gpu0.info.memory_bytes // 4  # the driver's rule
    assert gpu0.allocated_percent == 75 and not gpu1.pods
    assert "train" in render_text(view, live_source=None)
    only_web = build_view([dra_node], pods, slices=slices, claims=claims, namespace="web")
    assert [p.name for g in only_web[0].gpus for p in g.pods] == ["serve"]


def test_unreadable_dra_objects_are_skipped_not_fatal() -> None:
    broken_slice = node_slice("n1")
    broken_slice["spec"]["devices"][0]["capacity"]["memory"]["value"] = "lots"
    broken_claim = _reserved(allocated_claim("c", pool="n1", consumed={"gpuPercent": "x"}), "p")
    view = build_view(
        [{"metadata": {"name": "n1"}}], [], slices=[broken_slice], claims=[broken_claim]
    )
    assert view == []


def exporter_registry(backend: SimulatedBackend) -> CollectorRegistry:
    """A node exporter's series over the backend, sampled once."""
    exporter = build_exporter(
        backend=backend, node_name="node-a", placements=list, settings=SamplerSettings()
    )
    exporter.sampler.sample_once()
    registry = CollectorRegistry()
    registry.register(exporter.collector)
    return registry


def serve_exporter(backend: SimulatedBackend) -> tuple[str, Any]:
    """A node exporter over the backend, sampled once, as a running agent would serve it."""
    server = serve(registry=exporter_registry(backend), profiler=None, host="127.0.0.1")
    return f"http://127.0.0.1:{server.port}/metrics", server


def test_live_pipes_and_memory_from_the_node_exporter() -> None:
    backend = SimulatedBackend("2xH100-80GB", node_name="node-a")
    gpus = backend.inventory()
    backend.set_load(
        gpus[1].uuid, pipes={"fp32": 0.42}, sm_occupancy=0.3, memory_used_bytes=6 * 2**30
    )
    url, server = serve_exporter(backend)
    try:
        live = from_exporters([url])
    finally:
        server.stop()
    view = build_view([node("node-a", gpus)], [], live=live)
    text = render_text(view, live_source=live.source)
    assert "fp32 42%" in text
    assert "[simulated]" in text
    data = render_json(view, live_source=live.source)
    second = data["nodes"][0]["gpus"][1]
    assert second["pipes"]["fp32"] == pytest.approx(0.42)
    assert second["memory_used_bytes"] == 6 * 2**30
    assert json.loads(json.dumps(data)) == data


def test_gpu_without_gpm_shows_pipes_unavailable_not_zero() -> None:
    backend = SimulatedBackend("1xA100-80GB", node_name="node-a")
    url, server = serve_exporter(backend)
    try:
        live = from_exporters([url])
    finally:
        server.stop()
    view = build_view([node("node-a", backend.inventory())], [], live=live)
    text = render_text(view, live_source=live.source)
    assert "pipes: unavailable" in text
    assert "fp32 0%" not in text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.parametrize("url", ["localhost:9090", "ftp://x", "http://"])
def test_malformed_prometheus_url_names_the_flag(url: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        from_prometheus(url)
    assert err.value.field == "--prometheus"


def test_unreachable_exporter_names_the_flag() -> None:
    with pytest.raises(InvalidInputError) as err:
        from_exporters([f"http://127.0.0.1:{_free_port()}/metrics"], timeout_s=2)
    assert err.value.field == "--metrics-url"
    assert "cannot reach" in err.value.problem


def test_missing_kubeconfig_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["top", "--kubeconfig", str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --kubeconfig:") and "does not exist" in err


def test_help_lists_the_top_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    assert "top" in capsys.readouterr().out


def serve_guarded_exporter(token: str) -> tuple[str, MetricsServer]:
    """A node agent's /metrics that answers only ``token``: the TokenReview the agent asks the
    API server for (gpushare.kube.access, tested against a real API server in
    tests/faults/test_security_cluster.py) is stood in by a comparison."""

    def authorize(header: str | None, path: str, *, client: str = "") -> Access:
        if header == f"Bearer {token}":
            return Access(200, "allowed", "reader")
        if header is None:
            return missing_token(path)  # the node agent's own words
        return Access(403, f"{path}: stranger may not get it; fix: bind it a ClusterRole", "")

    registry = exporter_registry(SimulatedBackend("1xH100-80GB", node_name="node-a"))
    server = MetricsServer(registry=registry, host="127.0.0.1", port=0, authorize=authorize)
    server.start()
    return f"http://127.0.0.1:{server.port}/metrics", server


def test_a_guarded_exporter_is_read_with_the_token_file_and_refusals_say_what_to_give(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, server = serve_guarded_exporter("s3cret")
    good, wrong = tmp_path / "token", tmp_path / "wrong"
    good.write_text("s3cret\n")
    wrong.write_text("guess")
    try:
        with pytest.raises(InvalidInputError) as refused:
            from_exporters([url])
        assert refused.value.field == "--metrics-url"
        assert "HTTP 401" in refused.value.problem
        # The agent's whole explanation, never cut mid-word (issue 68).
        assert refused.value.problem.endswith(f"{missing_token('/metrics').reason})")
        assert "--bearer-token-file" in refused.value.fix
        with pytest.raises(InvalidInputError) as forbidden:
            from_exporters([url], token=read_token(str(wrong)))
        assert "HTTP 403" in forbidden.value.problem and "stranger" in forbidden.value.problem
        live = from_exporters([url], token=read_token(str(good)))
        assert live.source == url and live.scalars
        # Through the command line: without a cluster to list, the token is read first.
        code = main(["top", "--metrics-url", url, "--bearer-token-file", str(tmp_path / "no")])
        assert code == 1
        assert capsys.readouterr().err.startswith("error: --bearer-token-file: cannot read")
    finally:
        server.stop()


@pytest.mark.parametrize("content", ["", "two tokens", "x" * (70 * 1024)])
def test_a_token_file_without_one_token_is_refused_naming_the_flag(
    tmp_path: Path, content: str
) -> None:
    path = tmp_path / "token"
    path.write_text(content)
    with pytest.raises(InvalidInputError) as err:
        read_token(str(path))
    assert err.value.field == "--bearer-token-file"
    assert "does not hold one token" in err.value.problem


def test_a_token_file_without_a_live_source_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["top", "--bearer-token-file", str(tmp_path / "t")]) == 1
    assert "is given without a live source" in capsys.readouterr().err
