"""The kubelet PodResources API (v1 ``List``): which pod's container holds which device IDs.

Used as a fallback owner lookup: a GPU process whose pod the agent does not know can still be
named when exactly one container on the node holds that GPU.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpushare.api.names import DEVICE_ID_SEPARATOR, GPU_RESOURCES

if TYPE_CHECKING:
    from gpushare.node.core.podresources.v1 import api_pb2

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")


@dataclass(frozen=True)
class ContainerDevices:
    namespace: str
    pod: str
    container: str
    resource_name: str
    device_ids: tuple[str, ...]

    def gpu_uuids(self) -> set[str]:
        """GPU UUIDs behind gpushare device IDs (``<uuid>::<NN>``) or plain GPU UUIDs."""
        return {d.split(DEVICE_ID_SEPARATOR, 1)[0] for d in self.device_ids}


def flatten(response: "api_pb2.ListPodResourcesResponse") -> list[ContainerDevices]:
    """One entry per (pod, container, resource) from a ListPodResourcesResponse."""
    return [
        ContainerDevices(pod.namespace, pod.name, c.name, d.resource_name, tuple(d.device_ids))
        for pod in response.pod_resources
        for c in pod.containers
        for d in c.devices
    ]


def list_pod_resources(
    *, socket_path: Path = DEFAULT_SOCKET, timeout_s: float = 5.0
) -> list[ContainerDevices]:
    """Call the kubelet's ``List`` over its unix socket; raises grpc.RpcError on failure."""
    # gRPC and the generated stubs load only where the kubelet socket is used.
    import grpc  # noqa: PLC0415

    from gpushare.node.core.podresources.v1 import api_pb2, api_pb2_grpc  # noqa: PLC0415

    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        response = stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout_s)
    return flatten(response)


def gpu_holders(entries: list[ContainerDevices]) -> list[ContainerDevices]:
    """Only the containers holding GPUs (gpushare slices or whole ``nvidia.com/gpu``)."""
    return [e for e in entries if e.resource_name in (*GPU_RESOURCES, "nvidia.com/gpu")]


class PodResourcesPoller:
    """Keeps the kubelet's answer fresh in a daemon thread so scrapes only read memory."""

    def __init__(
        self,
        *,
        socket_path: Path = DEFAULT_SOCKET,
        refresh_s: float = 10.0,
        fetch: Callable[[], list[ContainerDevices]] | None = None,
    ) -> None:
        self._fetch = fetch or (lambda: list_pod_resources(socket_path=socket_path))
        self._refresh_s = refresh_s
        self._lock = threading.Lock()
        self._entries: list[ContainerDevices] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None
        self.refreshed_at: float | None = None

    def refresh(self) -> None:
        import grpc  # noqa: PLC0415

        try:
            entries = gpu_holders(self._fetch())
        except grpc.RpcError as exc:
            self.last_error = str(exc)
            return
        with self._lock:
            self._entries = entries
        self.last_error = None
        self.refreshed_at = time.monotonic()

    def __call__(self) -> list[ContainerDevices]:
        with self._lock:
            return list(self._entries)

    def start(self) -> None:
        def run() -> None:
            while not self._stop.is_set():
                self.refresh()
                self._stop.wait(self._refresh_s)

        self._thread = threading.Thread(target=run, name="gpushare-podresources", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
