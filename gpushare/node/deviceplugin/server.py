"""The DevicePlugin gRPC servicer: protobuf in, Allocator decisions out."""

import logging
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from gpushare.node.core.answer import AllocationError, ContainerAllocation
from gpushare.node.core.health import DeviceHealth
from gpushare.node.deviceplugin.allocator import Allocator
from gpushare.node.deviceplugin.devices import HEALTHY, UNHEALTHY, slice_ids
from gpushare.node.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)


def device_list(
    health: DeviceHealth, ids: Callable[[str], list[str]] = slice_ids
) -> api_pb2.ListAndWatchResponse:
    """``ids(uuid)`` for each GPU (100 slices, or devices.opportunistic_slice_ids), each
    carrying its GPU's health."""
    _, state = health.snapshot()
    return api_pb2.ListAndWatchResponse(
        devices=[
            api_pb2.Device(ID=ident, health=HEALTHY if ok else UNHEALTHY)
            for uuid, ok in state.items()
            for ident in ids(uuid)
        ]
    )


def to_proto(allocation: ContainerAllocation) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=allocation.envs,
        mounts=[
            api_pb2.Mount(
                container_path=m.container_path, host_path=m.host_path, read_only=m.read_only
            )
            for m in allocation.mounts
        ],
        devices=[
            api_pb2.DeviceSpec(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in allocation.devices
        ],
        cdi_devices=[api_pb2.CDIDevice(name=name) for name in allocation.cdi_devices],
    )


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    """Serves one registration's lifetime; ``stop()`` ends its ListAndWatch streams."""

    def __init__(
        self,
        *,
        allocator: Allocator,
        health: DeviceHealth,
        ids: Callable[[str], list[str]] = slice_ids,
    ) -> None:
        """``ids``: the device IDs advertised for one GPU (which resource this serves)."""
        self.allocator = allocator
        self.health = health
        self.ids = ids
        self._stopped = threading.Event()
        self.listed = threading.Event()
        """Set when the kubelet's ListAndWatch stream is handed this server's first device list:
        its admission counts these devices once the kubelet has applied it (KubeletCount)."""
        self.listings = 0
        """ListAndWatch streams opened so far (each one lists the devices anew)."""
        self.allocations = 0
        self.allocation_failures = 0

    def stop(self) -> None:
        self._stopped.set()

    def GetDevicePluginOptions(  # noqa: N802  (gRPC method name)
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    def ListAndWatch(  # noqa: N802  (gRPC method name)
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        version, _ = self.health.snapshot()
        response = device_list(self.health, self.ids)
        log.info("ListAndWatch: advertising %d slices", len(response.devices))
        self.listings += 1
        self.listed.set()
        yield response
        while not self._stopped.is_set() and context.is_active() and not self.health.closed:
            new = self.health.wait_change(version, timeout_s=1.0)
            if new != version:
                version = new
                response = device_list(self.health, self.ids)
                bad = sum(1 for d in response.devices if d.health != HEALTHY)
                log.info("ListAndWatch: health changed, %d unhealthy slices", bad)
                yield response

    def GetPreferredAllocation(  # noqa: N802  (gRPC method name)
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        responses = []
        for req in request.container_requests:
            chosen = self.allocator.preferred(
                list(req.available_deviceIDs), list(req.must_include_deviceIDs), req.allocation_size
            )
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    def Allocate(  # noqa: N802  (gRPC method name)
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse:
        started = time.perf_counter()
        ids = [list(r.devices_ids) for r in request.container_requests]
        try:
            decided = self.allocator.allocate(ids)
        except AllocationError as exc:
            self.allocation_failures += 1
            log.error("Allocate refused: %s", exc)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"gpushare: {exc}")
        except Exception as exc:
            self.allocation_failures += 1
            log.exception("Allocate failed")
            context.abort(grpc.StatusCode.INTERNAL, f"gpushare: Allocate failed: {exc}")
        self.allocations += 1
        log.info(
            "Allocate: %s -> pod %s in %.1f ms",
            [len(i) for i in ids],
            ", ".join(a.pod or "(derived)" for a in decided),
            (time.perf_counter() - started) * 1000,
        )
        return api_pb2.AllocateResponse(container_responses=[to_proto(a) for a in decided])

    def PreStartContainer(  # noqa: N802  (gRPC method name)
        self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()
