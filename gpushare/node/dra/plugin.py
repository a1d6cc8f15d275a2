"""Serving the DRA plugin on the kubelet's sockets and keeping it there.

The DRAPlugin service (v1 and v1beta1) listens on ``<kubelet-root>/plugins/gpu.gpushare.io/
dra.sock``; the registration service on ``<kubelet-root>/plugins_registry/
gpu.gpushare.io-reg.sock``, which the kubelet's plugin watcher finds (also after a kubelet
restart, by scanning the directory). Order: unlink stale sockets, serve the DRA socket, wait
until it accepts, and only then create the registration socket, so the kubelet never dials a
DRA endpoint nobody answers. The loop serves again when a socket disappears, on request
(SIGHUP) and after a failed start; sockets are removed in ``finally``.
"""

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from gpushare.api.dra import DRIVER
from gpushare.node.deviceplugin.plugin import wait_until_accepting
from gpushare.node.dra.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from gpushare.node.dra.server import DraPluginV1, DraPluginV1beta1, RegistrationServicer
from gpushare.node.dra.v1 import api_pb2_grpc as v1_grpc
from gpushare.node.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc

log = logging.getLogger(__name__)

DEFAULT_KUBELET_ROOT = Path("/var/lib/kubelet")
DRA_SOCKET = "dra.sock"
REGISTRATION_SOCKET = f"{DRIVER}-reg.sock"
CHECKPOINT_DIR_NAME = DRIVER


def plugin_dir(kubelet_root: Path) -> Path:
    """``<kubelet-root>/plugins/gpu.gpushare.io``: the DRA socket and the checkpoint."""
    return kubelet_root / "plugins" / DRIVER


def registration_socket(kubelet_root: Path) -> Path:
    return kubelet_root / "plugins_registry" / REGISTRATION_SOCKET


class DraPluginRunner:
    """Serves until ``stop`` is set; ``request_restart`` serves both sockets afresh."""

    def __init__(
        self,
        *,
        make_servicers: Callable[[], tuple[DraPluginV1, DraPluginV1beta1]],
        kubelet_root: Path = DEFAULT_KUBELET_ROOT,
        poll_s: float = 0.2,
        start_timeout_s: float = 5.0,
        retry_s: float = 1.0,
    ) -> None:
        self.make_servicers = make_servicers
        self.socket_path = plugin_dir(kubelet_root) / DRA_SOCKET
        self.registration_path = registration_socket(kubelet_root)
        self.poll_s = poll_s
        self.start_timeout_s = start_timeout_s
        self.retry_s = retry_s
        self.serving = threading.Event()
        self.starts = 0
        self.registration: RegistrationServicer | None = None
        self._restart = threading.Event()
        self._servers: list[grpc.Server] = []

    def request_restart(self) -> None:
        self._restart.set()

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                self._restart.clear()
                try:
                    self._start()
                except Exception as exc:
                    log.warning(
                        "DRA plugin start failed (%s); retrying in %.0f s", exc, self.retry_s
                    )
                    self._stop_servers()
                    stop.wait(self.retry_s)
                    continue
                reason = self._watch(stop)
                if reason:
                    log.info("DRA plugin serving again: %s", reason)
                self._stop_servers()
        finally:
            self._stop_servers()

    def _watch(self, stop: threading.Event) -> str | None:
        while not stop.wait(self.poll_s):
            if self._restart.is_set():
                return "restart requested"
            for path in (self.socket_path, self.registration_path):
                if not path.exists():
                    return f"{path} was removed"
        return None

    def _serve(self, path: Path, add: Callable[[grpc.Server], None], name: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        server = grpc.server(ThreadPoolExecutor(max_workers=8, thread_name_prefix=name))
        add(server)
        server.add_insecure_port(f"unix://{path}")
        server.start()
        self._servers.append(server)
        wait_until_accepting(path, timeout_s=self.start_timeout_s)

    def _start(self) -> None:
        v1, v1beta1 = self.make_servicers()

        def add_dra(server: grpc.Server) -> None:
            v1_grpc.add_DRAPluginServicer_to_server(v1, server)
            v1beta1_grpc.add_DRAPluginServicer_to_server(v1beta1, server)

        # The registration socket must not exist while the DRA socket does not answer.
        with contextlib.suppress(FileNotFoundError):
            self.registration_path.unlink()
        self._serve(self.socket_path, add_dra, "dra")
        registration = RegistrationServicer(endpoint=self.socket_path)
        self._serve(
            self.registration_path,
            lambda server: reg_grpc.add_RegistrationServicer_to_server(registration, server),
            "dra-registration",
        )
        self.registration = registration
        self.starts += 1
        self.serving.set()
        log.info(
            "DRA driver %s serving on %s, registration socket %s",
            DRIVER,
            self.socket_path,
            self.registration_path,
        )

    def _stop_servers(self) -> None:
        self.serving.clear()
        # Registration first: the kubelet must not find a plugin whose service is going away.
        for path in (self.registration_path, self.socket_path):
            with contextlib.suppress(OSError):
                if path.is_socket():
                    os.unlink(path)
        for server in reversed(self._servers):
            server.stop(grace=1.0).wait(2.0)
        self._servers = []
