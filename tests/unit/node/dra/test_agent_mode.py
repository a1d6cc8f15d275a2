"""The node agent's --mode dra: the flags, and an agent that publishes its ResourceSlice and
serves the DRA plugin instead of the device plugin."""

import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpushare.api.dra import DRIVER
from gpushare.api.names import AGENT_MODE_DRA, ANN_AGENT_MODE, ANN_AGENT_READY
from gpushare.api.pod import pod_info
from gpushare.node.agent import NodeAgent
from gpushare.node.dra.claims import ClaimRef
from gpushare.node.exporter import build_exporter
from gpushare.node.main import build_parser
from gpushare.node.settings import AgentSettings
from tests.unit.node.dra.helpers import (
    NODE,
    FakeClaims,
    FakeSlices,
    backend,
    claim,
    mps_config,
)

UID = "0b1c2d3e-0000-4000-8000-000000000001"


class FakeDraKube(FakeClaims, FakeSlices):
    def __init__(self) -> None:
        FakeClaims.__init__(self)
        FakeSlices.__init__(self)


class FakeNodeKube:
    def __init__(self) -> None:
        self.published: list[Mapping[str, str]] = []
        self.node_pods: list[dict[str, Any]] = [
            {
                "metadata": {"namespace": "ns", "name": "p1", "uid": "pod-uid-1"},
                "spec": {"nodeName": NODE},
                "status": {"phase": "Pending"},
            }
        ]

    def publish_node(
        self, *, annotations: Mapping[str, str], labels: Mapping[str, str | None]
    ) -> None:
        self.published.append(annotations)

    def raw_node_pods(self) -> list[dict[str, Any]]:
        """The node's pods, as the driver checks a claim's pod against them."""
        return self.node_pods


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dra_settings(tmp_path: Path) -> AgentSettings:
    """An agent in dra mode with its directories under ``tmp_path``."""
    return AgentSettings(
        node_name=NODE,
        mode="dra",
        mps_root=tmp_path / "mps",
        kubelet_root=tmp_path / "kubelet",
        cdi_dir=tmp_path / "cdi",
    )


def test_mode_and_cdi_dir_are_flags_with_deviceplugin_the_default() -> None:
    defaults = build_parser().parse_args([])
    assert (defaults.mode, defaults.cdi_dir) == ("deviceplugin", Path("/var/run/cdi"))
    args = build_parser().parse_args(
        ["--mode", "dra", "--cdi-dir", "/etc/cdi", "--kubelet-root", "/k"]
    )
    assert (args.mode, args.cdi_dir, args.kubelet_root) == ("dra", Path("/etc/cdi"), Path("/k"))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--mode", "both"])


def test_a_dra_agent_publishes_its_slice_and_serves_the_dra_plugin(tmp_path: Path) -> None:
    dra = FakeDraKube()
    kube = FakeNodeKube()
    settings = dra_settings(tmp_path)
    agent = NodeAgent(settings, backend=backend(), kube=kube, dra_kube=dra)
    agent.mps.ensure(g.uuid for g in agent.gpus)
    agent.publisher.publish()
    assert kube.published, "the node inventory is still published in dra mode"
    # ...saying the node serves claims, so the extender places no annotated pod there.
    assert kube.published[-1][ANN_AGENT_MODE] == AGENT_MODE_DRA
    (stored,) = dra.slices.values()
    assert stored["spec"]["driver"] == DRIVER
    assert [d["name"] for d in stored["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    assert agent.dra_plugin is not None
    assert agent.dra_plugin.socket_path == tmp_path / "kubelet/plugins" / DRIVER / "dra.sock"


def test_a_deviceplugin_agent_has_no_dra_parts(tmp_path: Path) -> None:
    agent = NodeAgent(
        AgentSettings(node_name=NODE, mps_root=tmp_path), backend=backend(), kube=None
    )
    assert agent.dra is None and agent.dra_plugin is None and agent.slices is None
    assert agent.publisher.node_metadata()[0][ANN_AGENT_MODE] == "deviceplugin"


def test_a_dra_agent_feeds_claims_of_running_pods_into_the_simulated_gpus(
    tmp_path: Path,
) -> None:
    """What the operator's profiler reads of a simulated GPU in DRA mode: the load of the
    claims prepared for running pods, at their thread caps or guaranteed shares
    (gpushare.node.simload)."""
    dra = FakeDraKube()
    dra.claims[("ns", "c1")] = claim(consumed={"gpuPercent": "30"}, config=mps_config(limit=50))
    settings = dra_settings(tmp_path)
    agent = NodeAgent(settings, backend=backend(), kube=FakeNodeKube(), dra_kube=dra)
    agent.mps.ensure(g.uuid for g in agent.gpus)
    assert agent.dra is not None
    agent.dra.prepare(ClaimRef(namespace="ns", uid=UID, name="c1"))
    busy, idle = (g.uuid for g in agent.gpus)

    pod = {"metadata": {"namespace": "ns", "name": "p1"}, "status": {"phase": "Pending"}}
    agent.simulated_load.feed([pod_info(pod)])
    assert agent.backend.sample(busy).pipes["tensor"] == 0.0  # its containers are not running

    pod["status"]["phase"] = "Running"
    agent.simulated_load.feed([pod_info(pod)])
    # Capped at 50 %, guaranteed 30 %: it counts the smaller, as an annotated pod does.
    assert agent.backend.sample(busy).pipes["tensor"] == pytest.approx(0.55 * 0.3)
    assert agent.backend.sample(idle).pipes["tensor"] == 0.0


def test_a_dra_agents_exporter_shows_pods_by_their_prepared_claims(tmp_path: Path) -> None:
    """Per-pod GPU series in DRA mode (docs/observability.md): a pod's claim gives its GPU,
    guaranteed share, thread cap and memory limit, as placement annotations do in
    device-plugin mode; a pod that finished drops out."""
    dra = FakeDraKube()
    dra.claims[("ns", "c1")] = claim(
        consumed={"gpuPercent": "30", "memory": "8Gi"}, config=mps_config(limit=50)
    )
    kube = FakeNodeKube()
    agent = NodeAgent(dra_settings(tmp_path), backend=backend(), kube=kube, dra_kube=dra)
    agent.mps.ensure(g.uuid for g in agent.gpus)
    agent.dra.prepare(ClaimRef(namespace="ns", uid=UID, name="c1"))  # type: ignore[union-attr]
    pod: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": "p1", "uid": "pod-uid-1"},
        "spec": {"nodeName": NODE},
        "status": {"phase": "Running", "containerStatuses": [
            {"name": "main", "containerID": "containerd://abc"}
        ]},
    }  # fmt: skip
    kube.node_pods = [pod]
    agent.refresh_pods()
    exporter = build_exporter(
        backend=agent.backend, node_name=NODE, placements=agent._claim_placements
    )
    registry = CollectorRegistry()
    registry.register(exporter.collector)
    exporter.sampler.sample_once()
    text = generate_latest(registry).decode()
    series = {
        (s.name, s.labels.get("pod")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    busy = agent.gpus[0].uuid
    assert series[("gpushare_pod_gpu_allocated_compute_ratio", "p1")] == pytest.approx(0.3)
    assert series[("gpushare_pod_gpu_active_thread_ratio", "p1")] == pytest.approx(0.5)
    assert series[("gpushare_pod_gpu_memory_limit_bytes", "p1")] == 8 * 2**30
    [allocation] = agent._claim_placements()
    assert allocation.gpu_uuids == (busy,) and allocation.containers == {"abc": "main"}
    pod["status"]["phase"] = "Succeeded"
    agent.refresh_pods()
    assert agent._claim_placements() == []


def test_a_stopping_agent_says_its_node_is_not_ready_before_it_exits(tmp_path: Path) -> None:
    """An agent told to stop (SIGTERM: pod deleted, DaemonSet rolled by `helm upgrade`)
    publishes ``gpushare.io/agent-ready: false`` on its way out, so no claim is allocated to its
    node until the next agent has registered with the kubelet (docs/node-agent.md)."""
    kube = FakeNodeKube()
    settings = dra_settings(tmp_path)
    settings = replace(settings, metrics_host="127.0.0.1", metrics_port=free_port())
    agent = NodeAgent(settings, backend=backend(), kube=kube, dra_kube=FakeDraKube())
    stop = threading.Event()
    running = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    running.start()
    deadline = time.monotonic() + 10
    while not kube.published and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kube.published, "the agent published its node at start"
    assert agent.not_ready_reason() == "the DRA driver is not registered with the kubelet"
    stop.set()
    running.join(timeout=20)
    assert not running.is_alive()
    assert kube.published[-1] == {ANN_AGENT_READY: "false"}
    assert agent.not_ready_reason() == "the node agent is stopping"
