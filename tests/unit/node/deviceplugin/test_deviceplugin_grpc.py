"""The DevicePlugin gRPC service over a real unix socket, as the kubelet sees it."""

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from gpushare.api.pod import PodInfo
from gpushare.node.core.health import DeviceHealth
from gpushare.node.core.serving import wait_until_accepting
from gpushare.node.deviceplugin.allocator import Allocator
from gpushare.node.deviceplugin.devices import HEALTHY, UNHEALTHY
from gpushare.node.deviceplugin.server import DevicePluginServicer
from gpushare.node.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from gpushare.node.gpu.simulated import SimulatedBackend
from gpushare.node.mps.manager import MpsManager


class NoKubernetes:
    """Stands where the API server would: these tests never reach Allocate's pod lookup."""

    def list_node_pods(self) -> list[PodInfo]:
        raise AssertionError("no pod lookup expected")

    def mark_allocated(self, pod: PodInfo) -> None:
        raise AssertionError("no pod lookup expected")

    def record_event(
        self, *, pod: PodInfo | None, reason: str, message: str, warning: bool
    ) -> None:
        raise AssertionError("no event expected")


Plugin = tuple[api_pb2_grpc.DevicePluginStub, DeviceHealth, MpsManager]


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[Plugin]:
    backend = SimulatedBackend("2xH100-80GB", node_name="unit")
    uuids = [g.uuid for g in backend.inventory()]
    health = DeviceHealth(uuids)
    mps = MpsManager(
        root=tmp_path / "mps",
        simulated=True,
        on_change=lambda u, up, why: health.set_problem(u, "mps", None if up else why),
    )
    allocator = Allocator(node_name="unit", gpus=backend.inventory, pods=NoKubernetes(), mps=mps)
    servicer = DevicePluginServicer(allocator=allocator, health=health)
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)
    sock = tmp_path / "dp.sock"
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    wait_until_accepting(sock, timeout_s=5)
    channel = grpc.insecure_channel(f"unix://{sock}")
    try:
        yield api_pb2_grpc.DevicePluginStub(channel), health, mps
    finally:
        servicer.stop()
        channel.close()
        server.stop(grace=0).wait()


def test_options_ask_the_kubelet_for_preferred_allocation(plugin: Plugin) -> None:
    stub, _, _ = plugin
    options = stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
    assert options.get_preferred_allocation_available
    assert not options.pre_start_required


def test_list_and_watch_streams_health_changes(plugin: Plugin) -> None:
    stub, health, _ = plugin
    stream = stub.ListAndWatch(api_pb2.Empty(), timeout=10)
    first = next(stream)
    assert len(first.devices) == 200
    assert {d.health for d in first.devices} == {HEALTHY}
    bad_gpu = health.uuids[1]
    threading.Timer(0.2, health.set_problem, args=(bad_gpu, "backend", "XID 79")).start()
    second = next(stream)
    unhealthy = {d.ID.split("::")[0] for d in second.devices if d.health == UNHEALTHY}
    assert unhealthy == {bad_gpu}
    assert sum(d.health == UNHEALTHY for d in second.devices) == 100
    threading.Timer(0.2, health.set_problem, args=(bad_gpu, "backend", None)).start()
    third = next(stream)
    assert {d.health for d in third.devices} == {HEALTHY}
    stream.cancel()


def test_allocate_of_unknown_gpu_fails_with_a_message(plugin: Plugin) -> None:
    stub, _, _ = plugin
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["GPU-nope::01"])]
    )
    with pytest.raises(grpc.RpcError) as err:
        stub.Allocate(request, timeout=5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not on node unit" in (err.value.details() or "")
