"""The node agent says it is ready (``/readyz``, node annotation ``gpushare.io/agent-ready``) only
once the kubelet has its healthy devices: registered, the device list received through
ListAndWatch, and counted as allocatable by the kubelet's admission. A kubelet here is a real
gRPC Registration server on the plugin directory's kubelet.sock that, like the kubelet, dials
the plugin back and opens ListAndWatch, and a pod-resources server that answers
GetAllocatableResources with the devices it has applied.
"""

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from gpushare.api.names import ANN_AGENT_READY, RESOURCE_GPU_OPPORTUNISTIC, RESOURCE_GPU_PERCENT
from gpushare.node.agent import NodeAgent
from gpushare.node.coexistence import HEALTH_SOURCE as OTHER_PLUGIN
from gpushare.node.core.podresources.v1 import api_pb2 as pr_pb2
from gpushare.node.core.podresources.v1 import api_pb2_grpc as pr_grpc
from gpushare.node.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from gpushare.node.gpu.selection import select_gpus
from gpushare.node.gpu.simulated import SimulatedBackend
from gpushare.node.settings import AgentSettings


def pod_resources_socket(plugin_dir: Path) -> Path:
    return plugin_dir.parent / "pod-resources.sock"


class Kubelet(api_pb2_grpc.RegistrationServicer):
    """Accepts a registration; when ``list_devices`` is set, reads the plugin's first device
    list as the kubelet's device manager does, and counts its devices as allocatable (in its
    pod-resources answer) once ``count_devices`` is set too (default: at once)."""

    def __init__(
        self,
        plugin_dir: Path,
        *,
        list_devices: threading.Event,
        count_devices: threading.Event | None = None,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.list_devices = list_devices
        self.count_devices = count_devices
        self.devices_seen: dict[str, int] = {}
        """Resource name -> devices in its plugin's first list."""
        self.counted: dict[str, list[str]] = {}
        """Resource name -> the device IDs its admission counts (healthy, applied)."""
        self._streams: list[grpc.Channel] = []
        self.server = grpc.server(ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_RegistrationServicer_to_server(self, self.server)
        pr_grpc.add_PodResourcesListerServicer_to_server(PodResources(self), self.server)
        self.server.add_insecure_port(f"unix://{plugin_dir / 'kubelet.sock'}")
        pod_resources = pod_resources_socket(plugin_dir)
        pod_resources.unlink(missing_ok=True)
        self.server.add_insecure_port(f"unix://{pod_resources}")
        self.server.start()

    def Register(  # noqa: N802  (gRPC method name)
        self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> api_pb2.Empty:
        endpoint = self.plugin_dir / request.endpoint
        threading.Thread(
            target=self._watch, args=(endpoint, request.resource_name), daemon=True
        ).start()
        return api_pb2.Empty()

    def _watch(self, endpoint: Path, resource: str) -> None:
        self.list_devices.wait(10)
        channel = grpc.insecure_channel(f"unix://{endpoint}")
        self._streams.append(channel)
        try:
            first = next(api_pb2_grpc.DevicePluginStub(channel).ListAndWatch(api_pb2.Empty()))
            self.devices_seen[resource] = len(first.devices)
        except grpc.RpcError:
            return
        if self.count_devices is not None:
            self.count_devices.wait(10)
        self.counted[resource] = [d.ID for d in first.devices if d.health == "Healthy"]

    def stop(self) -> None:
        for channel in self._streams:
            channel.close()
        self.server.stop(grace=0).wait()


class PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet

    def GetAllocatableResources(  # noqa: N802  (gRPC method name)
        self, request: pr_pb2.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pr_pb2.AllocatableResourcesResponse:
        return pr_pb2.AllocatableResourcesResponse(
            devices=[
                pr_pb2.ContainerDevices(resource_name=name, device_ids=ids)
                for name, ids in self.kubelet.counted.items()
            ]
        )


def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[NodeAgent]:
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    backend = SimulatedBackend("1xH100-80GB", node_name="n")
    settings = AgentSettings(
        node_name="n",
        mps_root=tmp_path / "mps",
        device_plugin_dir=plugins,
        pod_resources_socket=pod_resources_socket(plugins),
    )
    node_agent = NodeAgent(settings, backend=backend, kube=None)
    node_agent.mps.ensure(g.uuid for g in backend.inventory())
    stop = threading.Event()
    # The agent's one restart loop serves both device plugins, as in run().
    plugins_loop = threading.Thread(target=node_agent.plugins.run, args=(stop,), daemon=True)
    plugins_loop.start()
    try:
        yield node_agent
    finally:
        stop.set()
        plugins_loop.join(timeout=10)


def ready_annotation(agent: NodeAgent) -> str:
    return agent.publisher.node_metadata()[0][ANN_AGENT_READY]


def test_not_ready_until_the_kubelet_has_listed_the_devices(agent: NodeAgent) -> None:
    plugins = agent.settings.device_plugin_dir
    assert agent.not_ready_reason() == "the device plugin is not registered with the kubelet"
    assert ready_annotation(agent) == "false"
    listing = threading.Event()
    kubelet = Kubelet(plugins, list_devices=listing)
    try:
        eventually(agent.device_plugin.registered.is_set)
        # Registered, but the kubelet has not read the device list: its admission would
        # still refuse a pod ("no healthy devices present").
        assert agent.not_ready_reason() == "the kubelet has not listed the devices yet"
        assert agent._readyz("").status == 503
        listing.set()
        eventually(lambda: agent.not_ready_reason() is None)
        # 100 guaranteed slices and 300 opportunistic ones (the kubelet admits opportunistic
        # pods beside full guaranteed shares; docs/node-agent.md, "Device IDs").
        assert kubelet.devices_seen == {
            RESOURCE_GPU_PERCENT: 100,
            RESOURCE_GPU_OPPORTUNISTIC: 300,
        }
        assert ready_annotation(agent) == "true"
        assert agent._readyz("").status == 200
    finally:
        kubelet.stop()


def test_not_ready_until_the_kubelets_admission_counts_the_listed_devices(
    agent: NodeAgent,
) -> None:
    """The device list handed over is not yet the kubelet's: its stream reader applies it a
    moment later, and a pod admitted before that fails ("no healthy devices present")."""
    listing, counting = threading.Event(), threading.Event()
    listing.set()
    kubelet = Kubelet(
        agent.settings.device_plugin_dir, list_devices=listing, count_devices=counting
    )
    try:
        reason = "the kubelet has the device list but does not count the devices yet"
        # Both plugins registered and listed; the reason stays until the kubelet counts.
        eventually(lambda: agent.not_ready_reason() == reason)
        time.sleep(0.3)
        assert agent.not_ready_reason() == reason
        assert kubelet.devices_seen.get(RESOURCE_GPU_PERCENT) == 100
        assert agent._readyz("").status == 503
        assert ready_annotation(agent) == "false"
        counting.set()
        eventually(lambda: agent.not_ready_reason() is None)
        assert agent._readyz("").status == 200
        # Confirmed once per listing: the kubelet is not asked again for every bind.
        kubelet.counted.clear()
        assert agent.not_ready_reason() is None
    finally:
        kubelet.stop()


def test_a_kubelet_without_the_pod_resources_api_leaves_readiness_as_it_was(
    agent: NodeAgent,
) -> None:
    listing = threading.Event()
    listing.set()
    kubelet = Kubelet(agent.settings.device_plugin_dir, list_devices=listing)
    pod_resources = agent.settings.pod_resources_socket
    assert pod_resources is not None
    try:
        eventually(lambda: agent.not_ready_reason() is None)
        kubelet.server.stop(grace=0).wait()
        pod_resources.unlink(missing_ok=True)
        pod_resources.write_text("not a socket")
        agent.kubelet_count._confirmed = None  # as after a new listing
        assert agent.not_ready_reason() is None
    finally:
        kubelet.stop()


def test_a_kubelet_restart_makes_the_agent_not_ready_until_it_lists_again(
    agent: NodeAgent,
) -> None:
    plugins = agent.settings.device_plugin_dir
    listing = threading.Event()
    listing.set()
    first = Kubelet(plugins, list_devices=listing)
    eventually(lambda: agent.not_ready_reason() is None)
    registrations = agent.device_plugin.registrations
    # The kubelet restarts: its socket goes away and comes back as a new file.
    first.stop()
    (plugins / "kubelet.sock").unlink(missing_ok=True)
    eventually(lambda: agent.not_ready_reason() is not None)
    slow = threading.Event()
    second = Kubelet(plugins, list_devices=slow)
    try:
        eventually(lambda: agent.device_plugin.registrations > registrations)
        assert agent.not_ready_reason() == "the kubelet has not listed the devices yet"
        slow.set()
        eventually(lambda: agent.not_ready_reason() is None)
    finally:
        second.stop()


def test_no_healthy_gpu_is_not_ready(agent: NodeAgent) -> None:
    listing = threading.Event()
    listing.set()
    kubelet = Kubelet(agent.settings.device_plugin_dir, list_devices=listing)
    try:
        eventually(lambda: agent.not_ready_reason() is None)
        agent.health.set_problem(agent.health.uuids[0], "backend", "XID 79")
        assert agent.not_ready_reason() == "no healthy GPU"
        assert ready_annotation(agent) == "false"
    finally:
        kubelet.stop()


def test_gpus_another_plugin_advertises_leave_the_agent_ready(agent: NodeAgent) -> None:
    """Beside NVIDIA's device plugin (the GPU Operator) an agent whose GPUs are all advertised
    by the other plugin manages nothing: ready, not stuck (helm --wait, Argo CD and
    KubeDaemonSetRolloutStuck read its pod's readiness; #46). A fault of its own still counts."""
    listing = threading.Event()
    listing.set()
    kubelet = Kubelet(agent.settings.device_plugin_dir, list_devices=listing)
    try:
        eventually(lambda: agent.not_ready_reason() is None)
        (uuid,) = agent.health.uuids
        agent.health.set_problem(uuid, OTHER_PLUGIN, "advertised as nvidia.com/gpu")
        assert agent.not_ready_reason() is None
        assert agent._readyz("").status == 200
    finally:
        kubelet.stop()


def test_an_agent_managing_no_gpu_is_ready(tmp_path: Path) -> None:
    """Every GPU left out (another plugin's at start, MIG, not selected): the agent serves an
    empty device list and says it is ready."""
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    found = SimulatedBackend("1xA100-80GB+mig", node_name="n")
    backend, skipped = select_gpus(found, wanted=None, other_plugins={})
    assert [s.reason for s in skipped] == ["MigEnabled"] and not backend.inventory()
    settings = AgentSettings(
        node_name="n",
        mps_root=tmp_path / "mps",
        device_plugin_dir=plugins,
        pod_resources_socket=pod_resources_socket(plugins),
    )
    node_agent = NodeAgent(settings, backend=backend, kube=None)
    stop = threading.Event()
    # The agent's one restart loop serves both device plugins, as in run().
    loop = threading.Thread(target=node_agent.plugins.run, args=(stop,), daemon=True)
    loop.start()
    listing = threading.Event()
    listing.set()
    kubelet = Kubelet(plugins, list_devices=listing)
    try:
        eventually(lambda: node_agent.not_ready_reason() is None)
        assert kubelet.devices_seen.get(RESOURCE_GPU_PERCENT) == 0
        assert ready_annotation(node_agent) == "true"
    finally:
        kubelet.stop()
        stop.set()
        loop.join(timeout=10)
