"""gpushare beside another device plugin on the real kubelet, simulated GPUs.

NVIDIA's device plugin needs NVML and a GPU, so a stand-in registers with the kubelet as it
does: resource ``nvidia.com/gpu``, one device per GPU named by the GPU's UUID (its default
``deviceIDStrategy: uuid``), here the UUIDs of the node's simulated GPUs. The gpushare agent
(a host process on ``simulated:2xH100-80GB,1xA100-80GB+mig``) then has to:

- leave out the GPU the other plugin advertises and the MIG-enabled one at start, saying so in
  its log and in Node Events, and advertise only the remaining GPU;
- stop offering a GPU the other plugin starts advertising later (the kubelet's allocatable
  drops), and offer it again once the other plugin stops advertising it.

The test holds the node like the chart tests (no other node agent may serve the kubelet).
"""

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpushare.api.inventory import load_inventory
from gpushare.api.names import ANN_NODE_GPUS, RESOURCE_GPU_PERCENT
from gpushare.node.coexistence import allocatable_devices
from gpushare.node.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from gpushare.node.gpu.simulated import simulated_uuid
from tests.fixtures.chart_release import exclusive_node, node, wait_for
from tests.fixtures.cluster import REPO, LocalCluster

# The chart takes the node over (exclusive_node): run before host agents and controllers start.
pytestmark = [pytest.mark.cluster, pytest.mark.whole_node]

PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
POD_RESOURCES = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
OTHER_ENDPOINT = "gpushare-test-other-plugin.sock"
OTHER_RESOURCE = "nvidia.com/gpu"
SPEC = "2xH100-80GB,1xA100-80GB+mig"  # GPU 2 has MIG enabled


class OtherPlugin(api_pb2_grpc.DevicePluginServicer):
    """A device plugin advertising whole GPUs by UUID, as NVIDIA's does."""

    def __init__(self, device_ids: list[str]) -> None:
        self.device_ids = list(device_ids)
        self.changed = threading.Condition()
        self.version = 0
        self.stopped = False
        self.server: grpc.Server | None = None

    def advertise(self, device_ids: list[str]) -> None:
        with self.changed:
            self.device_ids = list(device_ids)
            self.version += 1
            self.changed.notify_all()

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:  # noqa: N802
        return api_pb2.DevicePluginOptions()

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
        seen = -1
        while context.is_active() and not self.stopped:
            with self.changed:
                if seen == self.version:
                    self.changed.wait(1.0)
                    continue
                seen = self.version
                ids = list(self.device_ids)
            yield api_pb2.ListAndWatchResponse(
                devices=[api_pb2.Device(ID=i, health="Healthy") for i in ids]
            )

    def Allocate(self, request: Any, context: Any) -> Any:  # noqa: N802
        return api_pb2.AllocateResponse(
            container_responses=[
                api_pb2.ContainerAllocateResponse() for _ in request.container_requests
            ]
        )

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:  # noqa: N802
        return api_pb2.PreferredAllocationResponse()

    def PreStartContainer(self, request: Any, context: Any) -> Any:  # noqa: N802
        return api_pb2.PreStartContainerResponse()

    def start(self) -> None:
        path = PLUGIN_DIR / OTHER_ENDPOINT
        path.unlink(missing_ok=True)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{path}")
        self.server.start()
        with grpc.insecure_channel(f"unix://{PLUGIN_DIR / 'kubelet.sock'}") as channel:
            api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(
                    version="v1beta1", endpoint=OTHER_ENDPOINT, resource_name=OTHER_RESOURCE
                ),
                timeout=10,
            )

    def stop(self) -> None:
        self.stopped = True
        with self.changed:
            self.changed.notify_all()
        if self.server is not None:
            self.server.stop(grace=1).wait(5)
        (PLUGIN_DIR / OTHER_ENDPOINT).unlink(missing_ok=True)


def allocatable(cluster: LocalCluster, resource: str) -> int:
    return int(node(cluster)["status"].get("allocatable", {}).get(resource, 0))


def node_events(cluster: LocalCluster) -> list[dict[str, Any]]:
    out = cluster.kubectl(
        "get", "events", "-n", "default", "-o", "json",
        "--field-selector", f"involvedObject.kind=Node,involvedObject.name={cluster.node_name}",
    )  # fmt: skip
    return json.loads(out)["items"]  # type: ignore[no-any-return]


def test_gpus_of_another_plugin_and_mig_gpus_are_left_to_others(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    uuids = [simulated_uuid(cluster.node_name, i) for i in range(3)]
    other = OtherPlugin([uuids[0]])
    log_path = tmp_path / "agent.log"
    agent: subprocess.Popen[bytes] | None = None
    with exclusive_node(cluster):
        try:
            other.start()
            wait_for(
                lambda: allocatable(cluster, OTHER_RESOURCE) == 1,
                timeout_s=60,
                what=f"the kubelet to offer 1 {OTHER_RESOURCE}",
            )
            with log_path.open("wb") as log:
                agent = subprocess.Popen(
                    [
                        sys.executable, "-m", "gpushare.node.main",
                        "--backend", f"simulated:{SPEC}",
                        "--node-name", cluster.node_name,
                        "--kubeconfig", str(cluster.kubeconfig),
                        "--mps-root", str(tmp_path / "mps"),
                        "--metrics-host", "127.0.0.1", "--metrics-port", "0",
                        "--other-plugin-check-seconds", "1",
                    ],
                    stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                    env={**os.environ, **cluster.env, "PYTHONPATH": str(REPO)},
                )  # fmt: skip

            # At start: GPU 0 is the other plugin's, GPU 2 has MIG; only GPU 1 is shared.
            wait_for(
                lambda: allocatable(cluster, RESOURCE_GPU_PERCENT) == 100,
                timeout_s=60,
                what=f"100 {RESOURCE_GPU_PERCENT} (one GPU) on the node",
            )
            published = load_inventory(node(cluster)["metadata"]["annotations"][ANN_NODE_GPUS])
            assert [g.uuid for g in published] == [uuids[1]]
            reasons = wait_for(
                lambda: (
                    {e["reason"] for e in node_events(cluster)}
                    >= {"GpuAdvertisedByOtherPlugin", "GpuMigEnabled"}
                    and {e["reason"]: e for e in node_events(cluster)}
                ),
                timeout_s=30,
                what="Node Events for the GPUs left out",
            )
            assert uuids[0] in reasons["GpuAdvertisedByOtherPlugin"]["message"]
            assert OTHER_RESOURCE in reasons["GpuAdvertisedByOtherPlugin"]["message"]
            assert uuids[2] in reasons["GpuMigEnabled"]["message"]
            text = log_path.read_text()
            assert "MIG enabled" in text and "already advertised by another device plugin" in text

            # Later: the other plugin also advertises GPU 1; gpushare stops offering it.
            before = len(node_events(cluster))
            other.advertise([uuids[0], uuids[1]])
            wait_for(
                lambda: allocatable(cluster, RESOURCE_GPU_PERCENT) == 0,
                timeout_s=60,
                what="gpushare to stop offering GPU 1",
            )
            wait_for(
                lambda: len(node_events(cluster)) > before,
                timeout_s=30,
                what="a Node Event for GPU 1",
            )
            assert any(
                e["reason"] == "GpuAdvertisedByOtherPlugin" and uuids[1] in e["message"]
                for e in node_events(cluster)
            )

            # The other plugin is told to leave GPU 1 alone: it is gpushare's again.
            other.advertise([uuids[0]])
            wait_for(
                lambda: allocatable(cluster, RESOURCE_GPU_PERCENT) == 100,
                timeout_s=90,
                what="gpushare to offer GPU 1 again",
            )
        except BaseException:
            if log_path.exists():
                print("\n".join(log_path.read_text().splitlines()[-40:]))
            raise
        finally:
            # Withdraw every device before stopping: the kubelet keeps a stopped plugin's last
            # list for its grace period, and later node agents must not see GPUs as taken.
            other.advertise([])
            wait_for(
                lambda: (
                    not any(
                        ids
                        for name, ids in allocatable_devices(socket_path=POD_RESOURCES)
                        if name == OTHER_RESOURCE
                    )
                ),
                timeout_s=60,
                what=f"the kubelet to list no {OTHER_RESOURCE} device",
            )
            other.stop()
            if agent is not None:
                agent.send_signal(signal.SIGTERM)
                try:
                    agent.wait(20)
                except subprocess.TimeoutExpired:
                    agent.kill()
                    agent.wait(5)
            # Leave the node as found: no inventory, no nvidia.com/gpu in its status (the
            # kubelet itself drops a gone plugin's resource after its 5-minute grace period).
            for field in ("capacity", "allocatable"):
                patch = [{"op": "remove", "path": f"/status/{field}/nvidia.com~1gpu"}]
                cluster.kubectl(
                    "patch", "node", cluster.node_name, "--subresource=status", "--type=json",
                    "-p", json.dumps(patch), check=False,
                )  # fmt: skip
            cluster.kubectl("annotate", "node", cluster.node_name, f"{ANN_NODE_GPUS}-", check=False)
