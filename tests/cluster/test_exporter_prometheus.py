"""A real Prometheus scrapes the exporter on the local cluster, and every dashboard panel's query
returns data.

The exporter runs standalone (``python -m bench.exporter.standalone``) over the simulated
backend with the cluster's real pods as input: busybox pods run on the node's kubelet, get
placement annotations as gpushare-scheduler writes them, and the exporter attributes their real
processes (PID -> cgroup -> pod UID) to them.

Panels fed by the controller (pending pods, protection evictions, GpuShare profiles) read the
controller's real metrics collector over a view holding a pending pod and a profiled GpuShare
(no controller process runs here); the DCGM row reads dcgm-exporter's series from a stand-in
(tests/fixtures/dcgm.py). Prometheus scrapes with static targets here; the ServiceMonitor path
is tests/cluster/test_monitoring_operator.py.
"""

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.exposition import start_http_server as serve_registry

from gpushare.api.inventory import dump_inventory
from gpushare.api.names import ANN_NODE_GPUS
from gpushare.cluster.metrics import Metrics
from gpushare.cluster.operator.guard import LatencyGuard
from gpushare.cluster.operator.settings import OperatorConfig
from gpushare.cluster.state.view import ClusterView
from gpushare.node.gpu.simulated import SimulatedBackend, simulated_uuid
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.dcgm import dcgm_registry
from tests.fixtures.prometheus import (
    free_port,
    panel_queries,
    query,
    running_prometheus,
    substitute,
)

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "gpushare-exporter-e2e"
SPEC = "2xH100-80GB,1xA100-80GB"
GIB = 2**30
# What the test places: pod -> (fraction, thread %, memory limit GiB, GPU indexes, class).
PODS = {
    "train-a": ("0.5", 50, 20, (0,), "batch"),
    "infer-b": ("0.25", 40, 10, (0,), "latency"),
    "wide-c": ("2", 100, 0, (0, 1), "batch"),
}


def _wait(what: str, check: Any, timeout_s: float = 60.0, every_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


def _pod_manifest(name: str, image: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "exporter-e2e"}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "sleep 3600"],
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def placed_pods(cluster: LocalCluster) -> Iterator[list[dict[str, Any]]]:
    """Running busybox pods, annotated with placements on the simulated node's GPUs."""
    cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true")
    cluster.kubectl("create", "namespace", NAMESPACE)
    try:
        for name in PODS:
            manifest = _pod_manifest(name, cluster.busybox_image, cluster.node_name)
            cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
        for name, (fraction, threads, mem_gib, gpus, klass) in PODS.items():
            uuids = ",".join(simulated_uuid(cluster.node_name, i) for i in gpus)
            cluster.kubectl(
                "annotate",
                "pod",
                "-n",
                NAMESPACE,
                name,
                f"gpushare.io/gpu-fraction={fraction}",
                f"gpushare.io/class={klass}",
                f"gpushare.io/gpu-uuid={uuids}",
                f"gpushare.io/active-thread-percentage={threads}",
                f"gpushare.io/memory-limit={mem_gib * GIB}",
                "gpushare.io/bind-time=2026-01-01T00:00:00.000000Z",
                "gpushare.io/state=allocated",
            )

        def running() -> list[dict[str, Any]] | None:
            items: list[dict[str, Any]] = json.loads(
                cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json")
            )["items"]
            ready = [
                p
                for p in items
                if p["status"].get("phase") == "Running"
                and all(c.get("containerID") for c in p["status"].get("containerStatuses", []))
            ]
            return items if len(ready) == len(PODS) else None

        yield _wait("the test pods to run", running, timeout_s=120)
    finally:
        # Its pods waited for: other tests must not see these placements on the node's GPUs.
        cluster.remove_namespace(NAMESPACE)


@pytest.fixture(scope="module")
def exporter_url(
    cluster: LocalCluster,
    placed_pods: list[dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    work = tmp_path_factory.mktemp("exporter")
    pods_file = work / "pods.json"
    pods_file.write_text(json.dumps({"items": placed_pods}))
    port_file = work / "port"
    log = (work / "exporter.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.exporter.standalone",
            "--backend",
            f"simulated:{SPEC}",
            "--node-name",
            cluster.node_name,
            "--pods-file",
            str(pods_file),
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--sample-interval",
            "0.5",
            "--mps-root",
            str(work / "mps"),
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        port = _wait("the exporter to serve", lambda: port_file.exists() and port_file.read_text())
        yield f"127.0.0.1:{int(port)}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def controller_stand_in(cluster: LocalCluster) -> Iterator[str]:
    """The controller's own collectors (view sizes, pending pods, GpuShare profiles, the
    operator guard's eviction counters) over a view fed by hand, plus dcgm-exporter's series
    for the simulated GPUs, on one loopback port each."""
    gpus = SimulatedBackend(SPEC, node_name=cluster.node_name).inventory()
    view = ClusterView()
    view.replace_nodes([{"metadata": {"name": cluster.node_name, "annotations": {}}}])
    view.replace_pods(
        [
            {
                "metadata": {
                    "name": "waiting",
                    "namespace": NAMESPACE,
                    "uid": "u-waiting",
                    "annotations": {"gpushare.io/gpu-fraction": "0.5"},
                },
                "spec": {"containers": [{"name": "main"}]},
                "status": {"phase": "Pending"},
            }
        ]
    )
    profile = {
        "gpuModel": gpus[0].model,
        "fp16": 0.1,
        "fp32": 0.3,
        "fp64": 0.0,
        "tensor": 0.6,
        "sampledSeconds": 30,
        "time": "2026-01-01T00:00:00Z",
        "simulated": True,
    }
    view.replace_shares(
        [{"metadata": {"namespace": NAMESPACE, "name": "trainer"}, "status": {"profile": profile}}]
    )
    metrics = Metrics(view)
    guard_view = ClusterView()
    guard_view.upsert_node(
        {
            "metadata": {
                "name": cluster.node_name,
                "annotations": {ANN_NODE_GPUS: dump_inventory(gpus)},
            }
        }
    )
    guard = LatencyGuard(
        config=OperatorConfig(),
        kube=None,  # type: ignore[arg-type]  # no latency pod: nothing to read or evict
        view=guard_view,
        profiler=None,  # type: ignore[arg-type]
        registry=metrics.registry,
    )
    asyncio.run(guard.tick())
    servers = []
    for registry in (metrics.registry, dcgm_registry(gpus, hostname=cluster.node_name)):
        port = free_port()
        servers.append((port, *serve_registry(port, addr="127.0.0.1", registry=registry)))
    try:
        yield ",".join(f"'127.0.0.1:{port}'" for port, _, _ in servers)
    finally:
        for _, server, thread in servers:
            server.shutdown()
            thread.join(5)


@pytest.fixture(scope="module")
def prometheus(
    exporter_url: str, controller_stand_in: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    work = tmp_path_factory.mktemp("prometheus")
    config = work / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        f"  - job_name: gpushare-exporter\n    static_configs:\n"
        f"      - targets: ['{exporter_url}']\n"
        f"  - job_name: controller-stand-in\n    static_configs:\n"
        f"      - targets: [{controller_stand_in}]\n"
    )
    with running_prometheus(config, work) as base:
        _wait(
            "two scrapes of the exporter",
            lambda: query(base, 'count_over_time(up{job="gpushare-exporter"}[1m]) >= 4'),
        )
        yield base


def test_every_dashboard_panel_query_returns_data(prometheus: str) -> None:
    # The control plane's series come from the controller's requests and the agent's device
    # plugin, which run in test_monitoring_operator.py, not here.
    queries = [q for q in panel_queries() if q[0] != "control-plane"]
    assert len(queries) >= 30
    empty = [
        f"{board}: {title}: {expr}"
        for board, title, expr in queries
        if not query(prometheus, substitute(expr))
    ]
    assert empty == [], "panels without data:\n" + "\n".join(empty)


def test_per_pod_memory_is_attributed_to_the_pods_real_processes(prometheus: str) -> None:
    rows = query(prometheus, f'gpushare_pod_gpu_memory_used_bytes{{namespace="{NAMESPACE}"}}')
    got = {
        (r["metric"]["pod"], r["metric"]["container"], r["metric"]["gpu_uuid"]): float(
            r["value"][1]
        )
        for r in rows
    }
    node = rows[0]["metric"]["node"] if rows else ""
    gpu0 = simulated_uuid(node, 0)
    # The simulated footprint is 80% of the memory limit (the agent's formula).
    assert got[("train-a", "main", gpu0)] == pytest.approx(0.8 * 20 * GIB, rel=1e-6)
    assert got[("infer-b", "main", gpu0)] == pytest.approx(0.8 * 10 * GIB, rel=1e-6)
    assert {pod for pod, _, _ in got} == set(PODS)


def test_gpu_without_gpm_shows_no_pipe_series_only_unavailable(prometheus: str) -> None:
    a100 = 'model="NVIDIA A100-SXM4-80GB"'
    assert query(prometheus, f"gpushare_gpu_pipe_utilization_ratio{{{a100}}}") == []
    flags = query(
        prometheus,
        f'gpushare_gpu_metric_available{{{a100}, metric="gpushare_gpu_pipe_utilization_ratio"}}',
    )
    assert len(flags) == 8
    assert {r["value"][1] for r in flags} == {"0"}
    assert query(prometheus, f"gpushare_gpu_utilization_ratio{{{a100}}}")


def test_every_exported_series_says_simulated(prometheus: str) -> None:
    total = query(prometheus, 'count({job="gpushare-exporter", __name__=~"gpushare_.*"})')
    assert float(total[0]["value"][1]) > 100
    assert (
        query(prometheus, '{job="gpushare-exporter", __name__=~"gpushare_.*", simulated!="true"}')
        == []
    )


def test_allocations_in_prometheus_match_the_placements(prometheus: str) -> None:
    rows = query(prometheus, "gpushare_gpu_allocated_compute_ratio")
    by_index = {r["metric"]["gpu_index"]: float(r["value"][1]) for r in rows}
    assert by_index == {"0": pytest.approx(1.75), "1": pytest.approx(1.0), "2": 0.0}
    saved = query(prometheus, "sum(gpushare_gpu_pods) - sum(gpushare_gpu_pods > bool 0)")
    assert float(saved[0]["value"][1]) == 2  # 4 pod-GPU pairs on 2 GPUs


def test_kubectl_gpushare_top_shows_pods_and_live_pipes(
    cluster: LocalCluster, prometheus: str
) -> None:
    node = json.loads(cluster.kubectl("get", "node", cluster.node_name, "-o", "json"))
    added = ANN_NODE_GPUS not in (node["metadata"].get("annotations") or {})
    if added:
        # No node agent has published the inventory: publish the simulated one for this test.
        inventory = SimulatedBackend(SPEC, node_name=cluster.node_name).inventory()
        cluster.kubectl(
            "annotate", "node", cluster.node_name, f"{ANN_NODE_GPUS}={dump_inventory(inventory)}"
        )
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gpushare.cli.main", "top", "--prometheus", prometheus,
             "-n", NAMESPACE, "-o", "json"],
            env={**cluster.env, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )  # fmt: skip
        text = subprocess.run(
            [sys.executable, "-m", "gpushare.cli.main", "top", "--prometheus", prometheus,
             "--node", cluster.node_name, "-n", NAMESPACE],
            env={**cluster.env, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )  # fmt: skip
    finally:
        if added:
            cluster.kubectl("annotate", "node", cluster.node_name, f"{ANN_NODE_GPUS}-")
    assert proc.returncode == 0, proc.stderr
    view = json.loads(proc.stdout)
    gpus = next(n for n in view["nodes"] if n["name"] == cluster.node_name)["gpus"]
    gpu0 = next(g for g in gpus if g["uuid"] == simulated_uuid(cluster.node_name, 0))
    pods = {p["name"]: p for p in gpu0["pods"]}
    assert set(pods) == set(PODS)
    assert (pods["infer-b"]["fraction_percent"], pods["infer-b"]["thread_percent"]) == (25, 40)
    assert pods["train-a"]["memory_used_bytes"] == pytest.approx(0.8 * 20 * GIB, rel=1e-6)
    assert gpu0["pipes"]["tensor_hmma"] > 0
    assert gpu0["simulated"] is True
    assert text.returncode == 0, text.stderr
    assert "infer-b" in text.stdout and "[simulated]" in text.stdout
