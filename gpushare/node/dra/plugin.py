"""Serving the DRA plugin on the kubelet's sockets and keeping it there.

The DRAPlugin service (v1 and v1beta1) listens on ``<kubelet-root>/plugins/gpu.gpushare.io/
dra.sock``; the registration service on ``<kubelet-root>/plugins_registry/
gpu.gpushare.io-reg.sock``, which the kubelet's plugin watcher finds (also after a kubelet
restart, by scanning the directory). Order: unlink stale sockets, serve the DRA socket, wait
until it accepts, and only then create the registration socket, so the kubelet never dials a
DRA endpoint nobody answers. The node's one restart loop (gpushare.node.core.serving) serves
again when a socket disappears, on request (SIGHUP) and after a failed start, and removes the
sockets when the agent stops.
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
from gpushare.node.core.serving import wait_until_accepting
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


class DraPluginSockets:
    """The DRA plugin's two sockets (a gpushare.node.core.serving.KubeletPlugin)."""

    name = "DRA plugin"

    def __init__(
        self,
        *,
        make_servicers: Callable[[], tuple[DraPluginV1, DraPluginV1beta1]],
        kubelet_root: Path = DEFAULT_KUBELET_ROOT,
        start_timeout_s: float = 5.0,
    ) -> None:
        self.make_servicers = make_servicers
        self.socket_path = plugin_dir(kubelet_root) / DRA_SOCKET
        self.registration_path = registration_socket(kubelet_root)
        self.start_timeout_s = start_timeout_s
        self.serving = threading.Event()
        self.starts = 0
        self.registration: RegistrationServicer | None = None
        self._servers: list[grpc.Server] = []

    def changed(self) -> str | None:
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

    def start(self) -> None:
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

    def stop(self) -> None:
        self.serving.clear()
        # Registration first: the kubelet must not find a plugin whose service is going away.
        for path in (self.registration_path, self.socket_path):
            with contextlib.suppress(OSError):
                if path.is_socket():
                    os.unlink(path)
        for server in reversed(self._servers):
            server.stop(grace=1.0).wait(2.0)
        self._servers = []
