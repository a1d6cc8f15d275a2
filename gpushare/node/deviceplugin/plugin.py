"""Serving the device plugin on the kubelet's socket directory and keeping it registered.

Order (as the kubelet requires): unlink a stale socket, serve, wait until the socket accepts,
then Register with ``kubelet.sock``. One restart loop (like NVIDIA's plugin) redoes all of it
when the kubelet restarts (a new kubelet deletes every socket in the directory and creates a
new ``kubelet.sock``), when our socket disappears, on request (SIGHUP) and after a failed start.
The directory is polled every 200 ms, so re-registration happens well within 5 s.
"""

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from gpushare.api.names import RESOURCE_GPU_PERCENT
from gpushare.node.deviceplugin.server import DevicePluginServicer
from gpushare.node.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_ENDPOINT = "gpushare-gpu-percent.sock"
OPPORTUNISTIC_ENDPOINT = "gpushare-opportunistic.sock"


def socket_identity(path: Path) -> tuple[int, int] | None:
    """(inode, change time) of a socket file: a recreated file may reuse the inode number."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_ctime_ns


def wait_until_accepting(path: Path, *, timeout_s: float) -> None:
    """Block until a unix socket accepts connections; TimeoutError otherwise."""
    deadline = time.monotonic() + timeout_s
    last: OSError | None = None
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(0.5)
            try:
                probe.connect(str(path))
                return
            except OSError as exc:
                last = exc
        time.sleep(0.02)
    raise TimeoutError(f"{path} does not accept connections: {last}")


class PluginRunner:
    """Runs the serve/register/watch loop until ``stop`` is set."""

    def __init__(
        self,
        *,
        make_servicer: Callable[[], DevicePluginServicer],
        plugin_dir: Path = DEFAULT_PLUGIN_DIR,
        endpoint: str = DEFAULT_ENDPOINT,
        resource_name: str = RESOURCE_GPU_PERCENT,
        poll_s: float = 0.2,
        register_timeout_s: float = 5.0,
        retry_s: float = 1.0,
    ) -> None:
        self.make_servicer = make_servicer
        self.plugin_dir = plugin_dir
        self.endpoint = endpoint
        self.resource_name = resource_name
        self.poll_s = poll_s
        self.register_timeout_s = register_timeout_s
        self.retry_s = retry_s
        self.socket_path = plugin_dir / endpoint
        self.kubelet_socket = plugin_dir / KUBELET_SOCKET
        self.registrations = 0
        self.registered = threading.Event()
        self._restart = threading.Event()
        self._server: grpc.Server | None = None
        self._servicer: DevicePluginServicer | None = None

    @property
    def servicer(self) -> DevicePluginServicer | None:
        return self._servicer

    def request_restart(self) -> None:
        """Serve and register again (SIGHUP)."""
        self._restart.set()

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                self._restart.clear()
                try:
                    kubelet_identity = self._start()
                except Exception as exc:
                    log.warning(
                        "device plugin start failed (%s); retrying in %.0f s", exc, self.retry_s
                    )
                    self._stop_server()
                    stop.wait(self.retry_s)
                    continue
                reason = self._watch(stop, kubelet_identity)
                if reason:
                    log.info("device plugin restarting: %s", reason)
                self._stop_server()
        finally:
            self._stop_server()

    def _watch(self, stop: threading.Event, kubelet_identity: tuple[int, int] | None) -> str | None:
        while not stop.wait(self.poll_s):
            if self._restart.is_set():
                return "restart requested"
            if not self.socket_path.exists():
                return f"{self.socket_path} was removed (kubelet restart?)"
            if socket_identity(self.kubelet_socket) != kubelet_identity:
                return f"{self.kubelet_socket} was recreated (kubelet restart)"
        return None

    def _start(self) -> tuple[int, int] | None:
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
        self._register()
        self.registrations += 1
        self.registered.set()
        log.info(
            "device plugin registered %s with the kubelet as %s (registration %d)",
            self.resource_name,
            self.socket_path,
            self.registrations,
        )
        return kubelet_identity

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

    def _stop_server(self) -> None:
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
