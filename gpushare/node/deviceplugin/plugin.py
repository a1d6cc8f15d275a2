"""The device plugin's sockets: one per resource in the kubelet's device-plugin directory.

Order (as the kubelet requires): unlink a stale socket, serve, wait until the socket accepts,
then Register with ``kubelet.sock``. The node's one restart loop
(gpushare.node.core.serving.RestartLoop) redoes all of it when the kubelet restarts (a new
kubelet deletes every socket in the directory and creates a new ``kubelet.sock``), when our
socket disappears, on request (SIGHUP) and after a failed start.
"""

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from gpushare.api.names import RESOURCE_GPU_PERCENT
from gpushare.node.core.serving import socket_identity, wait_until_accepting
from gpushare.node.deviceplugin.server import DevicePluginServicer
from gpushare.node.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_ENDPOINT = "gpushare-gpu-percent.sock"
OPPORTUNISTIC_ENDPOINT = "gpushare-opportunistic.sock"


class DevicePluginSockets:
    """One resource's device plugin (a gpushare.node.core.serving.KubeletPlugin)."""

    def __init__(
        self,
        *,
        make_servicer: Callable[[], DevicePluginServicer],
        plugin_dir: Path = DEFAULT_PLUGIN_DIR,
        endpoint: str = DEFAULT_ENDPOINT,
        resource_name: str = RESOURCE_GPU_PERCENT,
        register_timeout_s: float = 5.0,
    ) -> None:
        self.make_servicer = make_servicer
        self.plugin_dir = plugin_dir
        self.endpoint = endpoint
        self.resource_name = resource_name
        self.register_timeout_s = register_timeout_s
        self.socket_path = plugin_dir / endpoint
        self.kubelet_socket = plugin_dir / KUBELET_SOCKET
        self.registrations = 0
        self.registered = threading.Event()
        self._kubelet_identity: tuple[int, int] | None = None
        self._server: grpc.Server | None = None
        self._servicer: DevicePluginServicer | None = None

    @property
    def name(self) -> str:
        return f"device plugin {self.resource_name}"

    @property
    def servicer(self) -> DevicePluginServicer | None:
        return self._servicer

    def changed(self) -> str | None:
        if not self.socket_path.exists():
            return f"{self.socket_path} was removed (kubelet restart?)"
        if socket_identity(self.kubelet_socket) != self._kubelet_identity:
            return f"{self.kubelet_socket} was recreated (kubelet restart)"
        return None

    def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        servicer = self.make_servicer()
        server = grpc.server(ThreadPoolExecutor(max_workers=8, thread_name_prefix="deviceplugin"))
        api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server, self._servicer = server, servicer
        wait_until_accepting(self.socket_path, timeout_s=self.register_timeout_s)
        kubelet_identity = socket_identity(self.kubelet_socket)
        if kubelet_identity is None:
            raise FileNotFoundError(f"{self.kubelet_socket} does not exist (kubelet not running?)")
        self._kubelet_identity = kubelet_identity
        self._register()
        self.registrations += 1
        self.registered.set()
        log.info(
            "device plugin registered %s with the kubelet as %s (registration %d)",
            self.resource_name,
            self.socket_path,
            self.registrations,
        )

    def _register(self) -> None:
        with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            grpc.channel_ready_future(channel).result(timeout=self.register_timeout_s)
            stub = api_pb2_grpc.RegistrationStub(channel)
            stub.Register(
                api_pb2.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.endpoint,
                    resource_name=self.resource_name,
                    options=api_pb2.DevicePluginOptions(
                        pre_start_required=False, get_preferred_allocation_available=True
                    ),
                ),
                timeout=self.register_timeout_s,
            )

    def stop(self) -> None:
        self.registered.clear()
        if self._servicer is not None:
            self._servicer.stop()
        if self._server is not None:
            self._server.stop(grace=1.0).wait(2.0)
            self._server = None
        # Only remove the socket if it is still ours (a new kubelet may have cleaned up).
        with contextlib.suppress(OSError):
            if self.socket_path.is_socket():
                os.unlink(self.socket_path)
