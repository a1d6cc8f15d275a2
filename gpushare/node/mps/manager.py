"""One MPS control daemon per GPU: start, health-check, restart, adopt.

Each GPU gets ``<root>/<uuid>/{pipe,log,shm}`` and its own ``nvidia-cuda-mps-control -d`` with
``CUDA_VISIBLE_DEVICES=<uuid>``. Clients (containers) reach it through the pipe directory and a
shared ``/dev/shm``: in ``private`` shm mode the daemon runs in its own mount namespace with
``<root>/<uuid>/shm`` bind-mounted on ``/dev/shm``, and the device plugin mounts the same
directory as each container's ``/dev/shm`` (what NVIDIA's plugin does with a host tmpfs).

A daemon found alive at start (pid file in the pipe directory, process alive, control pipe
answering) is adopted, not restarted, so pods already running keep their MPS server; one that
does not answer is ended and replaced, never doubled (gpushare.node.mps.procs). Each step is
an Event (``on_event``). The manager never changes a GPU's compute mode and never stops daemons
on exit unless asked. In a container the daemons are started by gpushare-mps-launcher in a pod
of their own (``daemons="launcher"``, gpushare.node.mps.launch): a stopped container's
processes all end with it.

UIDs: an MPS server serves one Linux UID at a time; a client with another UID waits until the
server's clients have all exited. gpushare therefore gives every GPU one UID at a time: the
device plugin refuses to place a pod whose ``runAsUser`` differs from the UID of the pods
already allocated on that GPU (see ``gpushare.node.core.answer.check_uid``).
"""

import contextlib
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Literal

from gpushare.node.mps.compute_mode import ComputeModeGate
from gpushare.node.mps.launch import LaunchError, request_launch
from gpushare.node.mps.limits import ServerLimits
from gpushare.node.mps.procs import CONTROL_BINARY, control_daemons, end_process
from gpushare.node.mps.procs import cmdline as _cmdline
from gpushare.node.mps.procs import pid_alive as _pid_alive
from gpushare.node.mps.status import DaemonStatus, MpsError, MpsPaths, parse_server_list

log = logging.getLogger(__name__)

SERVER_BINARY = "nvidia-cuda-mps-server"
PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL_PIPE = "control"
ShmMode = Literal["private", "host"]
DaemonStarter = Literal["own", "launcher"]

# Called with (gpu uuid, daemon up?, reason) whenever a daemon's state changes.
ChangeCallback = Callable[[str, bool, str], None]
# Called with (gpu uuid, Event reason, message, warning?) when a daemon is adopted, started,
# replaced or found down: the agent records them as Node Events.
EventCallback = Callable[[str, str, str, bool], None]


class MpsManager:
    """Owns the control daemons of this node's GPUs. Thread-safe."""

    def __init__(
        self,
        *,
        root: Path,
        simulated: bool,
        shm_mode: ShmMode = "private",
        control_binary: str = CONTROL_BINARY,
        start_timeout_s: float = 15.0,
        query_timeout_s: float = 5.0,
        on_change: ChangeCallback | None = None,
        require_exclusive_process: bool = False,
        daemons: DaemonStarter = "own",
        on_event: EventCallback | None = None,
        set_exclusive_process: bool = False,
    ) -> None:
        """``set_exclusive_process``: gpushare.node.mps.compute_mode (off on test paths)."""
        self.root = root
        self.daemons: DaemonStarter = daemons
        """own: this process starts the daemons (they live in its cgroup); launcher:
        gpushare-mps-launcher starts them on request (``gpushare.node.mps.launch``)."""
        self.simulated = simulated
        self.shm_mode: ShmMode = shm_mode
        self.control_binary = control_binary
        self.start_timeout_s = start_timeout_s
        self.query_timeout_s = query_timeout_s
        self.on_change = on_change
        self.on_event = on_event
        self.require_exclusive_process = require_exclusive_process
        self._lock = threading.RLock()
        self._status: dict[str, DaemonStatus] = {}
        self._orphans: dict[str, set[int]] = {}
        self._limits: dict[str, ServerLimits] = {}
        self._compute_modes = ComputeModeGate(
            required=require_exclusive_process, simulated=simulated, timeout_s=query_timeout_s
        )
        self._compute_modes.close_door = set_exclusive_process
        if simulated:
            log.warning(
                "SIMULATED GPUs: the MPS manager runs no nvidia-cuda-mps-control daemon; it "
                "only creates the per-GPU pipe/log/shm directories under %s that pods mount",
                root,
            )

    # --- paths ---------------------------------------------------------------------------

    def paths(self, uuid: str) -> MpsPaths:
        base = self.root / uuid
        return MpsPaths(root=base, pipe=base / "pipe", log=base / "log", shm=base / "shm")

    def client_shm(self, uuid: str) -> Path:
        """Host directory to mount as a client container's /dev/shm (the daemon's /dev/shm)."""
        return self.paths(uuid).shm if self.shm_mode == "private" else Path("/dev/shm")

    def _make_dirs(self, paths: MpsPaths) -> None:
        for directory in (paths.pipe, paths.log, paths.shm):
            directory.mkdir(parents=True, exist_ok=True)
            # Pods may run as any UID; the MPS server they get runs as that UID and writes
            # its log and shared memory here. Sticky like /tmp, so nobody deletes others' files.
            # Containers get the pipe and shm directories only, never the log directory the
            # agent reads (docs/security.md).
            directory.chmod(0o1777)

    def _env(self, uuid: str, paths: MpsPaths) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            CUDA_VISIBLE_DEVICES=uuid,
            CUDA_MPS_PIPE_DIRECTORY=str(paths.pipe),
            CUDA_MPS_LOG_DIRECTORY=str(paths.log),
        )
        return env

    # --- queries -------------------------------------------------------------------------

    def status(self) -> dict[str, DaemonStatus]:
        with self._lock:
            return dict(self._status)

    def is_up(self, uuid: str) -> bool:
        with self._lock:
            status = self._status.get(uuid)
        return bool(status and status.up)

    def _read_pid(self, paths: MpsPaths) -> int | None:
        try:
            return int((paths.pipe / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None

    def query(self, uuid: str, command: str) -> str:
        """Send one command to the GPU's control daemon through its pipe; raise MpsError."""
        paths = self.paths(uuid)
        try:
            done = subprocess.run(
                [self.control_binary],
                input=command + "\n",
                capture_output=True,
                text=True,
                env=self._env(uuid, paths),
                timeout=self.query_timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(f"{command!r} to the MPS daemon of {uuid} failed: {exc}") from exc
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip()
            raise MpsError(f"{command!r} to the MPS daemon of {uuid} failed: {detail}")
        return done.stdout

    def _probe(self, uuid: str) -> tuple[int, tuple[int, ...]]:
        """(control daemon pid, server pids) when the daemon is alive and answers, else MpsError."""
        paths = self.paths(uuid)
        pid = self._read_pid(paths)
        if pid is None or not _pid_alive(pid):
            raise MpsError(f"no live MPS control daemon for {uuid} (pid file {pid})")
        if CONTROL_BINARY not in _cmdline(pid):
            raise MpsError(f"pid {pid} in {paths.pipe / PID_FILE} is not {CONTROL_BINARY}")
        # Answers whether or not a server runs yet: the liveness probe through the pipe.
        self.query(uuid, "get_default_active_thread_percentage")
        try:
            servers = parse_server_list(self.query(uuid, "get_server_list"))
        except MpsError:
            servers = ()
        return pid, servers

    # --- compute mode --------------------------------------------------------------------

    def compute_mode(self, uuid: str) -> str:
        """The GPU's compute mode (gpushare.node.mps.compute_mode); read only."""
        return self._compute_modes.mode(uuid)

    # --- limits --------------------------------------------------------------------------

    def limits(self, uuid: str) -> ServerLimits | None:
        """The limits last applied to the GPU's daemon and servers."""
        with self._lock:
            return self._limits.get(uuid)

    def apply_limits(self, uuid: str, limits: ServerLimits) -> bool:
        """Set the daemon's default limits (servers started later) and each running server's
        (its new clients) to ``limits``; True when the daemon took every command. A client's
        environment can then only lower them (gpushare.node.mps.limits)."""
        if self.simulated:
            with self._lock:
                first = uuid not in self._limits
                self._limits[uuid] = limits
            if first:
                log.info("SIMULATED: MPS limits of %s recorded, not sent: %s", uuid, limits)
            return True
        try:
            servers = parse_server_list(self.query(uuid, "get_server_list"))
            for command in limits.commands(servers):
                self.query(uuid, command)
        except MpsError as exc:
            log.warning("could not set MPS limits of %s to %s: %s", uuid, limits, exc)
            return False
        with self._lock:
            self._limits[uuid] = limits
        log.info("MPS limits of %s: %s (servers %s)", uuid, limits, servers)
        return True

    # --- lifecycle -----------------------------------------------------------------------

    def ensure(self, uuids: Iterable[str]) -> dict[str, DaemonStatus]:
        """Adopt or start a daemon for each GPU; returns their status (errors are logged).

        Called before the GPUs are advertised, so a GPU whose daemon is down is advertised
        unhealthy rather than handing pods an MPS pipe nobody listens on.
        """
        for uuid in uuids:
            self._ensure_one(uuid)
        return self.status()

    def _set(self, status: DaemonStatus) -> None:
        with self._lock:
            old = self._status.get(status.uuid)
            self._status[status.uuid] = status
        if self.on_change and (old is None or old.up != status.up):
            self.on_change(status.uuid, status.up, status.reason)

    def _event(self, uuid: str, reason: str, message: str, *, warning: bool) -> None:
        if self.on_event is not None:
            try:
                self.on_event(uuid, reason, message, warning)
            except Exception:  # an Event is a report; the daemon's state does not hang on it
                log.exception("could not report %s for %s", reason, uuid)

    def _ensure_one(self, uuid: str) -> DaemonStatus:
        """One GPU's daemon up: adopted when one answers, else started (unless simulated or
        refused by the GPU's compute mode)."""
        paths = self.paths(uuid)
        self._make_dirs(paths)
        with self._lock:
            known = self._status.get(uuid)
        restarts = known.restarts if known is not None else 0
        if self.simulated:
            status = DaemonStatus(uuid, up=True, simulated=True, reason="simulated: no daemon")
            self._set(status)
            return status
        closed = self._compute_modes.close(uuid)
        if closed is not None:
            self._event(uuid, "GpushareComputeModeSet", closed, warning=False)
        refusal = self._compute_modes.refusal(uuid)
        if refusal is not None:
            status = DaemonStatus(uuid, up=False, restarts=restarts, reason=refusal)
            self._set(status)
            return status
        try:
            pid, servers = self._probe(uuid)
        except MpsError as exc:
            log.info("MPS daemon for %s not running (%s); starting one", uuid, exc)
            why = str(exc)
        else:
            log.info("MPS daemon for %s adopted (pid %d, servers %s)", uuid, pid, servers)
            status = DaemonStatus(
                uuid, up=True, pid=pid, adopted=True, restarts=restarts, server_pids=servers
            )
            self._set(status)
            message = f"MPS daemon of GPU {uuid} adopted (pid {pid}, {len(servers)} servers)"
            self._event(uuid, "GpushareMpsDaemonAdopted", message, warning=False)
            return status
        return self._start_new(uuid, paths, known, restarts, why)

    def _start_new(
        self, uuid: str, paths: MpsPaths, known: DaemonStatus | None, restarts: int, why: str
    ) -> DaemonStatus:
        """Start (or have started) a daemon for a GPU whose daemon did not answer (``why``),
        replacing a stale one of ours; a Node Event says which, and a restarted daemon gets
        the limits MPS forgot."""
        stale = self._read_pid(paths)
        if stale is not None and not (_pid_alive(stale) and CONTROL_BINARY in _cmdline(stale)):
            stale = None
        try:
            pid = self._launch(uuid, paths)
            _, servers = self._probe(uuid)
        except MpsError as exc:
            log.error("MPS daemon for %s failed to start: %s", uuid, exc)
            status = DaemonStatus(uuid, up=False, restarts=restarts, reason=str(exc))
            self._set(status)
            if known is None:  # a GPU already down said so when it went down (check_one)
                self._event(
                    uuid,
                    "GpushareMpsDaemonDown",
                    f"MPS daemon of GPU {uuid} could not start: {exc}; the GPU takes no new "
                    "pods until it does",
                    warning=True,
                )
            return status
        log.info("MPS daemon for %s started (pid %d)", uuid, pid)
        replaced = stale is not None and stale != pid
        message = f"MPS daemon of GPU {uuid} started (pid {pid})"
        if replaced:
            message += f" in place of pid {stale}, which did not answer ({why}); its clients lost "
            message += "their MPS server"
        reason = "GpushareMpsDaemonReplaced" if replaced else "GpushareMpsDaemonStarted"
        self._event(uuid, reason, message, warning=replaced)
        status = DaemonStatus(uuid, up=True, pid=pid, restarts=restarts, server_pids=servers)
        limits = self.limits(uuid)
        if limits is not None:
            # A restarted daemon starts with MPS's own defaults (100 %, no memory limit).
            self.apply_limits(uuid, limits)
        self._set(status)
        return status

    def _launch(self, uuid: str, paths: MpsPaths) -> int:
        if self.daemons == "own":
            return self._start(uuid, paths)
        try:
            return request_launch(paths.root, timeout_s=self.start_timeout_s + 5.0)
        except LaunchError as exc:
            raise MpsError(str(exc)) from exc

    def ensure_daemon(self, uuid: str) -> int:
        """The pid of a running daemon for the GPU: the one that answers, else a new one
        (MpsError when it cannot start). What gpushare-mps-launcher does for each request."""
        paths = self.paths(uuid)
        try:
            pid, _ = self._probe(uuid)
        except MpsError as exc:
            log.info("MPS daemon for %s not running (%s); starting one", uuid, exc)
        else:
            return pid
        self._make_dirs(paths)
        return self._start(uuid, paths)

    def _start(self, uuid: str, paths: MpsPaths) -> int:
        binary = shutil.which(self.control_binary)
        if binary is None:
            raise MpsError(f"{self.control_binary} is not on PATH; install the NVIDIA driver utils")
        # The daemon the pid file names, and any other on this pipe directory (its pid file
        # lost or overwritten): never two daemons on one GPU (gpushare.node.mps.procs).
        old = self._read_pid(paths)
        ending = set(control_daemons(paths.pipe))
        if old is not None and _pid_alive(old) and CONTROL_BINARY in _cmdline(old):
            ending.add(old)
        for victim in sorted(ending):
            log.warning("MPS daemon for %s: ending pid %d, which does not answer", uuid, victim)
            end_process(victim)
        # Leftovers of a dead daemon make a new one refuse to start.
        for stale in paths.pipe.iterdir():
            with contextlib.suppress(OSError):
                stale.unlink()
        command = [binary, "-d"]
        if self.shm_mode == "private":
            # Own mount namespace with this GPU's shm directory as /dev/shm, shared with the
            # clients that get the same directory mounted as their /dev/shm.
            command = [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                'mount --bind "$0" /dev/shm && exec "$1" -d',
                str(paths.shm),
                binary,
            ]
        try:
            done = subprocess.run(
                command,
                env=self._env(uuid, paths),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=self.start_timeout_s,
                start_new_session=True,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(f"could not run {command[0]}: {exc}") from exc
        if done.returncode != 0:
            raise MpsError(
                f"{' '.join(command[:3])} exited {done.returncode}: "
                f"{done.stderr.decode(errors='replace').strip()}"
            )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            pid = self._read_pid(paths)
            if pid is not None and _pid_alive(pid) and (paths.pipe / CONTROL_PIPE).exists():
                return pid
            time.sleep(0.05)
        raise MpsError(f"daemon wrote no pid file/control pipe in {paths.pipe} in time")

    def check(self) -> dict[str, DaemonStatus]:
        """Health-check every daemon through its control pipe; restart the ones that are down.

        The GPU is reported down (``on_change``) before the restart and up after it, so the
        device plugin advertises its slices unhealthy meanwhile.
        """
        with self._lock:
            uuids = list(self._status)
        for uuid in uuids:
            self.check_one(uuid)
        return self.status()

    def check_one(self, uuid: str) -> DaemonStatus:
        with self._lock:
            current = self._status.get(uuid)
        if current is None or self.simulated:
            return current or self._ensure_one(uuid)
        try:
            pid, servers = self._probe(uuid)
        except MpsError as exc:
            log.warning("MPS daemon for %s is down: %s; restarting it", uuid, exc)
            if current.up:
                self._event(
                    uuid,
                    "GpushareMpsDaemonDown",
                    f"MPS daemon of GPU {uuid} is down ({exc}); restarting it",
                    warning=True,
                )
            # Its servers keep serving their clients; remember them so stop() can end them.
            with self._lock:
                self._orphans.setdefault(uuid, set()).update(current.server_pids)
            self._set(replace(current, up=False, reason=str(exc), restarts=current.restarts + 1))
            return self._ensure_one(uuid)
        status = replace(current, up=True, pid=pid, server_pids=servers, reason="")
        self._set(status)
        return status

    def stop(self, uuid: str) -> None:
        """Quit one daemon (``quit`` through its pipe; SIGTERM if it does not answer) and end
        the MPS servers it leaves behind, including those of daemons that died earlier."""
        if self.simulated:
            return
        paths = self.paths(uuid)
        pid = self._read_pid(paths)
        with self._lock:
            servers = set(self._orphans.pop(uuid, set()))
            known = self._status.get(uuid)
        if known is not None:
            servers.update(known.server_pids)
        with contextlib.suppress(MpsError):
            servers.update(parse_server_list(self.query(uuid, "get_server_list")))
        try:
            self.query(uuid, "quit")
        except MpsError as exc:
            log.warning("quit to MPS daemon of %s failed (%s); signalling it", uuid, exc)
        if pid is not None:
            for _ in range(100):
                if not _pid_alive(pid):
                    break
                time.sleep(0.05)
            else:
                end_process(pid)
        for server in servers:
            if _pid_alive(server) and SERVER_BINARY in _cmdline(server):
                end_process(server)
        with self._lock:
            self._status.pop(uuid, None)

    def stop_all(self) -> None:
        with self._lock:
            uuids = list(self._status)
        for uuid in uuids:
            self.stop(uuid)
