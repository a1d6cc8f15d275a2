"""Serving the node's kubelet plugins, and the one loop that serves them again.

Both kubelet plugins (the device plugin's two resources, or the DRA driver) follow the same
rules: unlink a stale socket, serve, wait until the socket accepts, and only then tell the
kubelet (Register on ``kubelet.sock``, or the registration socket its plugin watcher finds).
One restart loop (like NVIDIA's ``cmd/nvidia-device-plugin/main.go``) serves all of the mode's
plugins again together when one of them says its sockets changed (a restarted kubelet deletes
every socket in its directories), on request (SIGHUP), and after a failed start (retried every
``retry_s``). The sockets are polled every ``poll_s`` (200 ms), so re-registration follows a
kubelet restart well within the 5 s the kubelet allows (docs/node-agent.md, "Start order and
the restart loop").
"""

import logging
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)


class KubeletPlugin(Protocol):
    """One plugin's sockets, as the restart loop drives them."""

    @property
    def name(self) -> str:
        """What the logs call it ("device plugin gpushare.io/gpu-percent", "DRA plugin")."""

    def start(self) -> None:
        """Serve and make the kubelet find it; raises when that fails."""

    def changed(self) -> str | None:
        """Why it must be served again (a socket gone, kubelet.sock recreated); None if not."""

    def stop(self) -> None:
        """Stop serving and remove the sockets that are still its own."""


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


class RestartLoop:
    """Serves ``plugins`` until ``stop`` is set; ``request_restart`` serves them afresh."""

    def __init__(
        self, plugins: Sequence[KubeletPlugin], *, poll_s: float = 0.2, retry_s: float = 1.0
    ) -> None:
        self.plugins = list(plugins)
        self.poll_s = poll_s
        self.retry_s = retry_s
        self._restart = threading.Event()

    def request_restart(self) -> None:
        """Serve and register every plugin again (SIGHUP)."""
        self._restart.set()

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                self._restart.clear()
                try:
                    for plugin in self.plugins:
                        plugin.start()
                except Exception as exc:
                    log.warning(
                        "%s start failed (%s); retrying in %.0f s",
                        self._names(),
                        exc,
                        self.retry_s,
                    )
                    self._stop_all()
                    stop.wait(self.retry_s)
                    continue
                reason = self._watch(stop)
                if reason:
                    log.info("%s serving again: %s", self._names(), reason)
                self._stop_all()
        finally:
            self._stop_all()

    def _watch(self, stop: threading.Event) -> str | None:
        while not stop.wait(self.poll_s):
            if self._restart.is_set():
                return "restart requested"
            for plugin in self.plugins:
                reason = plugin.changed()
                if reason:
                    return reason
        return None

    def _stop_all(self) -> None:
        for plugin in reversed(self.plugins):
            try:
                plugin.stop()
            except Exception:
                log.exception("stopping %s failed", plugin.name)

    def _names(self) -> str:
        return ", ".join(p.name for p in self.plugins)
