"""Node agent pieces that need no cluster: pod reading, node publishing, simulated load, CLI."""

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import gpushare
from gpushare.api.inventory import load_inventory
from gpushare.api.logs import JsonFormatter
from gpushare.api.names import (
    ANN_BIND_TIME,
    ANN_CONTAINER,
    ANN_GPU_UUID,
    ANN_NODE_GPUS,
    ANN_STATE,
    ANN_THREAD_PERCENT,
    LABEL_MPS_CAPABLE,
    LABEL_SIMULATED,
)
from gpushare.api.pod import pod_info
from gpushare.node.agent import NodeAgent
from gpushare.node.gpu.simulated import SimulatedBackend
from gpushare.node.settings import AgentSettings
from gpushare.node.simload import Share, simulated_load

GIB = 2**30


def manifest(**spec: object) -> dict[str, object]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "creationTimestamp": "2026-11-01T10:00:00Z",
            "annotations": {ANN_GPU_UUID: "GPU-x"},
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def test_pod_uid_and_request_come_from_the_gpu_container() -> None:
    pod = pod_info(
        manifest(
            securityContext={"runAsUser": 1000},
            containers=[
                {"name": "sidecar", "securityContext": {"runAsUser": 7}},
                {
                    "name": "main",
                    "resources": {"limits": {"gpushare.io/gpu-percent": "25"}},
                    "securityContext": {"runAsUser": 2000},
                },
            ],
        )
    )
    assert pod.requested_slices == (25,)
    assert pod.run_as_user == 2000
    assert pod.key == "ns/p" and pod.created is not None


def test_pod_level_uid_applies_and_annotation_names_the_gpu_container() -> None:
    data = manifest(
        securityContext={"runAsUser": 1000},
        containers=[{"name": "a"}, {"name": "b", "securityContext": {"runAsUser": 3}}],
    )
    assert pod_info(data).run_as_user == 1000
    data["metadata"]["annotations"][ANN_CONTAINER] = "b"  # type: ignore[index]
    assert pod_info(data).run_as_user == 3
    assert pod_info(manifest(containers=[{"name": "a"}])).run_as_user is None


def test_simulated_load_follows_the_thread_shares_on_the_gpu() -> None:
    gpu = SimulatedBackend("1xH100-80GB", node_name="n").inventory()[0]
    idle = simulated_load(gpu, [])
    assert set(idle.pipes.values()) == {0.0} and idle.memory_used_bytes == 0
    half = simulated_load(gpu, [Share(30, 10 * GIB), Share(20, 0)])
    assert half.pipes["tensor_hmma"] == pytest.approx(0.275)
    assert half.sm_occupancy == pytest.approx(0.3)
    assert half.memory_used_bytes == int(10 * GIB * 0.8) + int(gpu.memory_bytes * 20 // 100 * 0.8)
    full = simulated_load(gpu, [Share(80, 0), Share(80, 0)])
    assert full.pipes["tensor"] == pytest.approx(0.55)  # capped at a whole GPU


def test_the_agent_feeds_running_allocated_pods_into_the_simulated_gpus(tmp_path: Path) -> None:
    backend = SimulatedBackend("2xH100-80GB", node_name="n")
    agent = NodeAgent(AgentSettings(node_name="n", mps_root=tmp_path), backend=backend, kube=None)
    busy, idle = (g.uuid for g in backend.inventory())

    def placed(uuid: str, state: str, phase: str) -> dict[str, object]:
        return {
            "metadata": {
                "annotations": {
                    ANN_GPU_UUID: uuid,
                    ANN_THREAD_PERCENT: "50",
                    ANN_BIND_TIME: "2026-11-01T10:00:00Z",
                    ANN_STATE: state,
                }
            },
            "status": {"phase": phase},
        }

    agent.simulated_load.feed(
        [
            pod_info(placed(busy, "allocated", "Running")),
            pod_info(placed(idle, "assumed", "Pending")),
        ]
    )
    assert backend.sample(busy).pipes["tensor_hmma"] == pytest.approx(0.275)
    assert backend.sample(idle).pipes["tensor_hmma"] == 0.0


def test_node_publishing_says_simulated_and_lists_every_gpu(tmp_path: Path) -> None:
    backend = SimulatedBackend("2xH100-80GB", node_name="n")
    agent = NodeAgent(AgentSettings(node_name="n", mps_root=tmp_path), backend=backend, kube=None)
    agent.mps.ensure(g.uuid for g in backend.inventory())
    agent.health.set_problem(backend.inventory()[1].uuid, "backend", "XID 79")
    annotations, labels = agent.publisher.node_metadata()
    assert labels == {LABEL_MPS_CAPABLE: "true", LABEL_SIMULATED: "true"}
    gpus = load_inventory(annotations[ANN_NODE_GPUS])
    assert [g.uuid for g in gpus] == [g.uuid for g in backend.inventory()]
    assert [g.healthy for g in gpus] == [True, False]
    assert all(g.mps_ready and g.simulated for g in gpus)


def test_logs_are_one_json_object_per_line() -> None:
    record = logging.LogRecord(
        "gpushare.x", logging.WARNING, __file__, 1, "GPU %s down", ("g0",), None
    )
    record.gpu = "g0"
    line = JsonFormatter(component="gpushare-node-agent").format(record)
    entry = json.loads(line)
    assert entry["msg"] == "GPU g0 down" and entry["level"] == "WARNING"
    assert entry["gpu"] == "g0" and entry["component"] == "gpushare-node-agent"


def test_kopfs_settings_attached_to_each_record_stay_out_of_the_line() -> None:
    record = logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, "Handler ok", (), None)
    record.settings = "OperatorSettings(" + "x" * 2000 + ")"
    record.k8s_ref = {"namespace": "ml", "name": "train"}
    entry = json.loads(JsonFormatter(component="gpushare-controller").format(record))
    assert "settings" not in entry
    assert "train" in entry["k8s_ref"]  # which object it was about stays


def test_cli_help_and_bad_backend() -> None:
    entry = [sys.executable, "-m", "gpushare.node.main"]
    shown = subprocess.run([*entry, "--help"], capture_output=True, text=True, check=True)
    for flag in ("--backend", "--node-name", "--kubeconfig", "--device-plugin-dir", "--mps-root"):
        assert flag in shown.stdout
    bad = subprocess.run(
        [*entry, "--backend", "simulated:2xB9000", "--node-name", "n"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2
    assert "--backend simulated:<spec>: unknown GPU model 'B9000'" in bad.stderr


def test_the_agent_says_its_version_on_metrics(tmp_path: Path) -> None:
    """gpushare_build_info{component="node-agent", version} 1 on the agent's /metrics
    registry, so a mixed rollout shows as two versions (issue #46)."""
    backend = SimulatedBackend("1xH100-80GB", node_name="n")
    agent = NodeAgent(AgentSettings(node_name="n", mps_root=tmp_path), backend=backend, kube=None)
    text = generate_latest(agent.registry).decode()
    (info,) = [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "gpushare_build_info"
    ]
    assert info.value == 1.0
    assert info.labels["component"] == "node-agent"
    assert info.labels["version"] == gpushare.__version__
    assert info.labels["simulated"] == "true"
