"""Fatal GPU faults of MPS clients: detect them, say who was involved, recover, and find the
workload that keeps faulting.

Why: a fatal fault in one MPS client (an illegal memory access, a device-side assert) is
reported to every client of that GPU's MPS server, so the pods sharing the GPU fail with it
(seen on an H200: an innocent neighbour's next GEMM failed; the server survived and took new
clients about a second later). Users see only "illegal memory access" in every pod.

Who faulted cannot be read off one fault: the server's ``Client {PID: X, Context: 1}
encountered a fatal GPU error`` line and the kernel's Xid 31 line name the same process, but on
an H200 with driver 580 that process was the real faulter in only about half of the faults
measured (the other half it was the victim, whichever client started first). So an incident
keeps the named client as evidence ("named by the MPS server") and treats every client torn
down with it as *involved*; Events say exactly that. Guilt is concluded across incidents: a
workload involved in ``exclusive_after`` faults whose other involved workloads have nothing in
common is the common factor (a victim shares its faults only with the faulter).

How: each GPU's MPS daemon writes ``control.log`` and ``server.log`` into its log directory
(``<mps-root>/<uuid>/log``). The monitor follows both files, tracks which client PIDs are
connected to which server, and turns fault lines into a :class:`FaultIncident`: the client(s)
the server names, and every other client torn down with it or connected at the time. Client
PIDs are resolved to pods while the clients live (``/proc/<pid>/cgroup``, or the PID namespace
mapping when the server logs a container-side PID). Then it

- records a Warning Event on the named pod (``GpuShareFault``: the server named it, which is
  not proof) and on each other involved pod (``GpuShareFaultVictim``), and counts them;
- health-checks the GPU's MPS daemon (the manager restarts a daemon that does not answer);
- follows the recovery: the server takes no new client (CUDA error 807, "Server teardown in
  progress") until every affected client has exited. A pod that keeps its broken context gets an
  Event after ``linger_after_s`` and is marked for eviction (``gpushare.io/evict``) after
  ``evict_lingering_after_s``, because it blocks the GPU for every new pod. (``terminate_client``
  through the control daemon is no remedy: on driver 580 it only asks the client to exit and
  blocks the control daemon, health checks included, until it does.)
- marks the culprit (:class:`RepeatOffenders`: involved in ``exclusive_after`` faults within
  ``window_s`` whose other involved workloads have no workload in common) for an exclusive GPU:
  listed in the node annotation ``gpushare.io/exclusive-workloads`` (the admission webhook
  gives the workload's new pods a whole GPU, which runs without MPS) and its pod annotated
  ``gpushare.io/evict``: the gpushare controller evicts it (the node agent has no eviction
  right), so its own controller recreates it on a GPU of its own.
- separates workloads that keep faulting together (their faults always involve the same
  others, so nothing can be concluded): one pod of them, chosen by :func:`pick_to_separate`, is
  marked ``gpushare.io/evict`` but not exclusive, so it is recreated and the next fault, beside
  other neighbours, tells which one faults.

The parsing and classification are pure functions; the monitor does its I/O through the
callables it is given, so it is tested without a GPU or a cluster.
"""

import logging
import re
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpushare.api.errors import InvalidInputError
from gpushare.api.exclusive import (
    ExclusiveWorkload,
    dump_exclusive,
    load_exclusive,
    load_separated,
)
from gpushare.api.names import (
    ANN_EVICT,
    ANN_EXCLUSIVE,
    ANN_NODE_EXCLUSIVE,
    ANN_NODE_SEPARATED,
    SLICES_PER_GPU,
)
from gpushare.api.placement import format_time, parse_placement
from gpushare.node.deviceplugin.pods import PodInfo
from gpushare.node.exporter.attribution import parse_cgroup

log = logging.getLogger(__name__)

LOG_FILES = ("server.log", "control.log")
MAX_INITIAL_READ = 8 * 2**20
"""Bytes of an existing log read at start (to learn which clients are connected)."""
READ_CHUNK = 256 * 2**10
"""Bytes of a log read at once: however much was appended, memory stays bounded."""
MAX_LINE = 16 * 2**10
"""A longer line is no MPS log line: it is dropped, not buffered."""
MAX_CHUNKS_PER_CHECK = 32
"""Chunks of one log taken in per check (8 MiB): a flood is read over several checks."""

# ---- parsing ------------------------------------------------------------------------------

_LINE = re.compile(
    r"^\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?)\s+(?P<source>[A-Za-z][A-Za-z ]*?)"
    r"\s+(?P<pid>\d+)\]\s?(?P<msg>.*)$"
)
_CONNECT = re.compile(
    r"(?:[Cc]lient\s*\{\s*PID:\s*(\d+)[^}]*\}\s*connected)|(?:[Nn]ew client (\d+) connected)"
    r"|(?:[Cc]lient (\d+) connected)"
)
# "Client process 1453 disconnected" (driver 580); "Client 14777 disconnected" (older).
_DISCONNECT = re.compile(
    r"[Cc]lient\s*(?:process\s+)?(?:\{\s*PID:\s*)?(\d+)[^\n]*?(?:disconnected|has exited)"
)
_PIDS = re.compile(r"(?:PID:\s*|[Cc]lients?\s+(?:process\s+)?|\bpid[ =:]+|process\s+)(\d+)")
# What an MPS server writes when a client faults (H200, driver 580; tests/faults/data):
#   Client {PID: 1455, Context: 1} encountered a fatal GPU error.
#   Server is handling a fatal GPU error.
#   Client {PID: 1453, Context ID: 1} on device 0 to be torn down          (every client)
#   All clients belonging to error trigging process 1453 will be torn down  (every client!)
#   The following client process have a sticky error set:
#   1455
#   1453
# Only the "encountered" line names the cause; the others list everyone the fault reaches.
_FAULT_WORDS = re.compile(
    r"\bfatal\b|\bexception\b|\bfault(?:s|ed|ing)?\b|\billegal\b|\bxid\b|\bsticky\b"
    r"|\bunrecoverable\b|device-side assert|\berrors?\b|torn down",
    re.IGNORECASE,
)
_CAUSE_WORDS = re.compile(r"\bencounter|\bcaused\b|\boriginat", re.IGNORECASE)
_AFFECTED_WORDS = re.compile(
    r"torn down|sticky|affect|notif|terminat|\bkill|\breset|victim|requesting client",
    re.IGNORECASE,
)
_STICKY_HEADER = re.compile(r"sticky error set", re.IGNORECASE)
_SERVER_EXIT = re.compile(r"Server (\d+) exited")
# The server dropped its broken GPU context: every affected client has gone.
_CONTEXT_DESTROYED = re.compile(r"Destroy server context", re.IGNORECASE)
# Lines with a fault word that are routine.
_ROUTINE = re.compile(
    r"Receive command failed, assuming client exit|did not send valid credentials"
    r"|set to|Starting|started|Startup|Refusing to accept|Failed to accept client",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class MpsLogLine:
    """One line of an MPS daemon or server log."""

    at: float
    """When it was logged (epoch seconds; MPS logs local time to the millisecond)."""
    source: str
    """``Control``, ``Server``, ``Other``, ... as the log writes it."""
    pid: int
    """PID of the process that logged it (the control daemon or the MPS server)."""
    message: str
    text: str


def parse_log_line(text: str) -> MpsLogLine | None:
    """``[2026-11-21 10:00:01.123 Server  4428] message`` -> MpsLogLine; None if not that shape."""
    match = _LINE.match(text.rstrip("\n"))
    if match is None:
        return None
    stamp = match["ts"]
    try:
        moment = datetime.strptime(
            stamp, "%Y-%m-%d %H:%M:%S.%f" if "." in stamp else "%Y-%m-%d %H:%M:%S"
        )
    except ValueError:
        return None
    return MpsLogLine(
        at=moment.timestamp(),
        source=match["source"].strip(),
        pid=int(match["pid"]),
        message=match["msg"].strip(),
        text=text.rstrip("\n"),
    )


def _first_pid(match: re.Match[str]) -> int:
    return int(next(g for g in match.groups() if g))


def connected_pid(line: MpsLogLine) -> int | None:
    match = _CONNECT.search(line.message)
    return _first_pid(match) if match else None


def disconnected_pid(line: MpsLogLine) -> int | None:
    match = _DISCONNECT.search(line.message)
    return int(match.group(1)) if match else None


def is_fault_line(line: MpsLogLine) -> bool:
    """A line reporting a fatal GPU error (not a client connecting or leaving normally)."""
    if connected_pid(line) is not None:
        return False
    if not _FAULT_WORDS.search(line.message):
        return False
    return not _ROUTINE.search(line.message)


def mentioned_pids(line: MpsLogLine) -> list[int]:
    """Client PIDs a line names (never the PID of the server that logged it)."""
    return [int(p) for p in _PIDS.findall(line.message) if int(p) != line.pid]


# ---- incidents ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultIncident:
    """One fatal fault on one GPU's MPS server, as the logs tell it."""

    gpu_uuid: str
    server_pid: int | None
    logged_at: float
    """When the first fault line was logged."""
    detected_at: float
    """When the monitor read it."""
    faulting_pids: tuple[int, ...]
    """Clients the server named (``encountered a fatal GPU error``); empty when the log names
    none. Evidence, not proof: on driver 580 the named client was the real faulter in about
    half of the faults measured on an H200 (the kernel's Xid line names the same process)."""
    victim_pids: tuple[int, ...]
    """Other clients the fault tore down (or connected to the server when it happened)."""
    evidence: tuple[str, ...]
    """The fault lines, as logged (at most a few)."""

    @property
    def attributed(self) -> bool:
        """The server named a client (which may not be the one that faulted)."""
        return bool(self.faulting_pids)

    @property
    def named_pids(self) -> tuple[int, ...]:
        """Clients named by the MPS server (same as ``faulting_pids``)."""
        return self.faulting_pids

    @property
    def involved_pids(self) -> tuple[int, ...]:
        """Every client the fault tore down: the real faulter is one of them."""
        return (*self.faulting_pids, *self.victim_pids)

    @property
    def detection_s(self) -> float:
        return max(0.0, self.detected_at - self.logged_at)


def classify(
    fault_lines: list[MpsLogLine], connected: Iterable[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(faulting pids, victim pids) from the lines of one fault and the clients that were
    connected. A pid on a "cause" line (``encountered a fatal GPU error``) is the faulter; pids
    on "affected" lines (torn down, sticky error) and the connected clients are victims. When
    no line names a cause, a single pid named on a plain fault line is taken as the faulter."""
    causes: list[int] = []
    affected: list[int] = []
    plain: list[int] = []
    listing = False
    for line in fault_lines:
        message = line.message.strip()
        if listing and message.isdigit():
            affected.append(int(message))  # one pid per line under the sticky-error header
            continue
        listing = bool(_STICKY_HEADER.search(message))
        pids = mentioned_pids(line)
        if not pids:
            continue
        if _AFFECTED_WORDS.search(message):
            affected += pids
        elif _CAUSE_WORDS.search(message):
            causes += pids
        else:
            plain += pids
    faulting = list(dict.fromkeys(causes))
    if not faulting and len(set(plain)) == 1:
        faulting = [plain[0]]
        plain = []
    others = [*affected, *plain, *connected]
    victims = [p for p in dict.fromkeys(others) if p not in faulting and p > 0]
    return tuple(faulting), tuple(victims)


class ServerState:
    """Connected clients of each MPS server of one GPU, learned from its logs."""

    def __init__(self) -> None:
        self.clients: dict[int, set[int]] = defaultdict(set)
        self.broken: set[int] = set()
        """Clients an earlier fault broke that have not left yet."""
        self.last_server: int | None = None

    def connected(self, server: int | None) -> set[int]:
        if server is not None:
            return set(self.clients.get(server, set()))
        return set().union(*self.clients.values()) if self.clients else set()

    def healthy(self, server: int | None) -> set[int]:
        """Connected clients no earlier fault broke."""
        return self.connected(server) - self.broken

    def feed(self, line: MpsLogLine) -> None:
        if line.source.lower().endswith("server") or line.source == "Other":
            self.last_server = line.pid
        pid = connected_pid(line)
        if pid is not None:
            self.clients[line.pid].add(pid)
            return
        gone = disconnected_pid(line)
        if gone is not None:
            self.broken.discard(gone)
            for clients in self.clients.values():
                clients.discard(gone)
        ended = _SERVER_EXIT.search(line.message) if line.source == "Control" else None
        if ended is not None:
            for pid in self.clients.pop(int(ended.group(1)), set()):
                self.broken.discard(pid)


@dataclass
class OpenIncident:
    """An incident whose affected clients have not all left yet: until they have, the MPS
    server takes no new client ("Server teardown in progress", CUDA error 807)."""

    incident: FaultIncident
    remaining: set[int]
    recovered_at: float | None = None


class FaultDetector:
    """Turns one GPU's log lines into incidents. Lines of one fault arrive within a moment of
    each other; an incident is emitted once no new fault line came for ``settle_s``. It then
    stays open until every affected client has left the server (its recovery)."""

    def __init__(self, gpu_uuid: str, *, settle_s: float = 0.2, since: float = 0.0) -> None:
        self.gpu_uuid = gpu_uuid
        self.settle_s = settle_s
        self.since = since
        """Fault lines logged before this (e.g. before the agent started) are history."""
        self.state = ServerState()
        self.open: list[OpenIncident] = []
        self._pending: list[MpsLogLine] = []
        self._pending_connected: set[int] = set()
        self._pending_gone: dict[int, float] = {}
        self._last_fault_read = 0.0
        self._recovered: list[OpenIncident] = []

    def feed(self, lines: Iterable[MpsLogLine], *, now: float) -> list[int]:
        """Take new lines in; returns the client PIDs that connected (to resolve while alive)."""
        connected: list[int] = []
        for line in lines:
            if self._pending and line.message.strip().isdigit():
                self._pending.append(line)  # a pid listed under the sticky-error header
                continue
            if is_fault_line(line) and line.at >= self.since:
                if not self._pending:
                    server = line.pid if line.source != "Control" else self.state.last_server
                    self._pending_connected = self.state.healthy(server)
                    self._pending_gone = {}
                self._pending.append(line)
                self._last_fault_read = now
                continue
            pid = connected_pid(line)
            if pid is not None:
                connected.append(pid)
            gone = disconnected_pid(line)
            if gone is not None:
                if self._pending:
                    self._pending_gone[gone] = line.at
                self._left(gone, line.at)
            if _CONTEXT_DESTROYED.search(line.message):
                for item in self.open:
                    if item.incident.server_pid in (None, line.pid):
                        self._close(item, line.at)
            self.state.feed(line)
        return connected

    def _left(self, pid: int, at: float) -> None:
        for item in self.open:
            item.remaining.discard(pid)
            if not item.remaining:
                self._close(item, at)

    def _close(self, item: OpenIncident, at: float) -> None:
        if item in self.open:
            item.recovered_at = at
            self.open.remove(item)
            self._recovered.append(item)

    def incidents(self, *, now: float) -> list[FaultIncident]:
        if not self._pending or now - self._last_fault_read < self.settle_s:
            return []
        lines, self._pending = self._pending, []
        servers = [ln.pid for ln in lines if ln.source != "Control"]
        server = servers[0] if servers else self.state.last_server
        faulting, victims = classify(lines, self._pending_connected)
        # Every client of the server is broken by the fault and must exit: it is no victim of a
        # later fault.
        self.state.broken.update((*faulting, *victims))
        incident = FaultIncident(
            gpu_uuid=self.gpu_uuid,
            server_pid=server,
            logged_at=lines[0].at,
            detected_at=now,
            faulting_pids=faulting,
            victim_pids=victims,
            evidence=tuple(ln.text for ln in lines if not ln.message.strip().isdigit())[:6],
        )
        remaining = {*faulting, *victims} - set(self._pending_gone)
        item = OpenIncident(incident, remaining)
        self.open.append(item)
        if not remaining:
            self._close(item, max(self._pending_gone.values(), default=lines[-1].at))
        return [incident]

    @property
    def pending(self) -> bool:
        """Fault lines were read whose incident is not out yet (more may follow at once)."""
        return bool(self._pending)

    def recovered(self) -> list[OpenIncident]:
        """Incidents closed since the last call (every affected client gone)."""
        done, self._recovered = self._recovered, []
        return done


# ---- following log files ------------------------------------------------------------------


class LogTail:
    """New complete lines of a file that grows, is truncated or is replaced, read in chunks of
    at most ``chunk`` bytes (``behind`` tells when more is waiting), with lines longer than
    ``MAX_LINE`` dropped: a log flooded by anyone costs bounded memory (issue: an 8 MiB append
    quadrupled the agent's memory)."""

    def __init__(self, path: Path, *, from_start: bool = True, chunk: int = READ_CHUNK) -> None:
        self.path = path
        self.chunk = chunk
        self._offset = 0
        self._inode: int | None = None
        self._partial = b""
        self._from_start = from_start
        self.behind = False
        self.dropped_lines = 0
        self._skip_rest = False
        """The chunk ended inside an over-long line: its rest, up to the next newline, goes."""

    def read(self) -> list[str]:
        try:
            stat = self.path.stat()
        except OSError:
            return []
        if self._inode != stat.st_ino or stat.st_size < self._offset:
            first = self._inode is None
            self._inode, self._partial = stat.st_ino, b""
            if first and not self._from_start:
                self._offset = stat.st_size
            else:
                self._offset = max(0, stat.st_size - MAX_INITIAL_READ) if first else 0
        if stat.st_size == self._offset:
            self.behind = False
            return []
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read(min(self.chunk, stat.st_size - self._offset))
        except OSError:
            return []
        self._offset += len(data)
        self.behind = self._offset < stat.st_size
        data = self._partial + data
        *complete, partial = data.split(b"\n")
        if len(partial) > MAX_LINE:
            self.dropped_lines += 1
            partial = b""
            self._skip_rest = True
        elif complete and self._skip_rest:
            complete = complete[1:]  # the tail of a dropped line
            self._skip_rest = False
        self._partial = partial
        lines = [line for line in complete if line.strip()]
        long = [line for line in lines if len(line) > MAX_LINE]
        self.dropped_lines += len(long)
        return [line.decode(errors="replace") for line in lines if len(line) <= MAX_LINE]


# ---- PIDs to pods -------------------------------------------------------------------------


def _nspids(proc_root: Path, pid: int) -> list[int]:
    """``NSpid`` of a process: its PID in each PID namespace, outermost first."""
    try:
        for line in (proc_root / str(pid) / "status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def _pod_of_host_pid(proc_root: Path, pid: int) -> str | None:
    try:
        owner = parse_cgroup((proc_root / str(pid) / "cgroup").read_text())
    except OSError:
        return None
    return owner.pod_uid if owner else None


class PodResolver:
    """Client PID (as the MPS server logs it) -> pod UID.

    The server may log a host PID or, for a client in a container's PID namespace, the PID the
    client sees; the second is matched against the innermost ``NSpid`` of the GPU's live
    client processes (``candidates``, host PIDs from NVML), and only when exactly one pod
    matches. Results are cached, because a faulting client is often gone by the time its fault
    is read."""

    def __init__(
        self,
        *,
        proc_root: Path = Path("/proc"),
        candidates: Callable[[str], Iterable[int]] | None = None,
        cache_size: int = 4096,
    ) -> None:
        self.proc_root = proc_root
        self.candidates = candidates
        self._cache: dict[tuple[str, int], str] = {}
        self._order: deque[tuple[str, int]] = deque()
        self._cache_size = cache_size

    def remember(self, gpu_uuid: str, pid: int) -> str | None:
        key = (gpu_uuid, pid)
        if key in self._cache:
            return self._cache[key]
        uid = self._lookup(gpu_uuid, pid)
        if uid is not None:
            self._cache[key] = uid
            self._order.append(key)
            while len(self._order) > self._cache_size:
                self._cache.pop(self._order.popleft(), None)
        return uid

    def _lookup(self, gpu_uuid: str, pid: int) -> str | None:
        live = list(self.candidates(gpu_uuid)) if self.candidates else []
        if pid in live or not live:
            found = _pod_of_host_pid(self.proc_root, pid)
            if found is not None or pid in live:
                return found
        owners = {
            _pod_of_host_pid(self.proc_root, host)
            for host in live
            if (ns := _nspids(self.proc_root, host)) and len(ns) > 1 and ns[-1] == pid
        }
        owners.discard(None)
        if len(owners) == 1:
            return owners.pop()
        return _pod_of_host_pid(self.proc_root, pid) if live else None


# ---- workloads and repeat offenders -------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """What recreates a pod: its controller, else the pod itself."""

    uid: str
    kind: str
    namespace: str
    name: str

    @property
    def label(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


def workload_of(pod: Mapping[str, Any]) -> Workload:
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace", ""))
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("uid"):
            return Workload(str(ref["uid"]), str(ref.get("kind", "")), namespace, str(ref["name"]))
    return Workload(str(meta.get("uid", "")), "Pod", namespace, str(meta.get("name", "")))


def _mark(workload: Workload, incident: FaultIncident, count: int) -> ExclusiveWorkload:
    """The node annotation entry for ``workload`` after ``count`` faults, the last
    ``incident``."""
    return ExclusiveWorkload(
        uid=workload.uid,
        kind=workload.kind,
        namespace=workload.namespace,
        name=workload.name,
        faults=count,
        since=format_time(datetime.fromtimestamp(incident.logged_at, tz=UTC)),
        gpu_uuid=incident.gpu_uuid,
    )


UNKNOWN_WORKLOAD = "?"
"""An involved client no pod was found for: it may be the same workload every time, so it
counts as one partner common to every incident it appears in (it never clears anyone)."""


@dataclass(frozen=True)
class Verdict:
    """What the faults within the window say after one more incident."""

    culprits: Mapping[str, int]
    """Workload UID -> faults it was involved in, for each workload involved in ``threshold``
    faults whose other involved workloads have no workload in common: it is the common factor
    (a victim shares its faults only with the faulter)."""
    together: tuple[str, ...]
    """Workloads involved in every one of ``threshold`` faults with each other (the same set
    keeps faulting together): nothing can be concluded; one of them should be moved away.
    Empty when there are culprits."""


class RepeatOffenders:
    """Fatal faults within a sliding window, each as the set of workloads it involved.

    Pure: the monitor feeds it the involved workloads of each incident (every client the fault
    tore down, not the one the MPS server named, which on driver 580 is right about half the
    time) and acts on the :class:`Verdict`. Once a culprit is found, the faults it was involved
    in are explained and dropped, so its victims are not implicated by them later."""

    def __init__(self, *, threshold: int, window_s: float) -> None:
        self.threshold = threshold
        self.window_s = window_s
        self._incidents: deque[tuple[float, frozenset[str]]] = deque()

    def record(self, involved: Iterable[str], at: float) -> Verdict:
        """Add one fault (the UIDs of the workloads it involved, ``UNKNOWN_WORKLOAD`` for a
        client without a pod) at ``at``; returns what the window now says."""
        workloads = frozenset(involved)
        self._incidents.append((at, workloads))
        self._incidents = deque((t, ws) for t, ws in self._incidents if at - self.window_s <= t)
        if self.threshold <= 0:
            return Verdict(culprits={}, together=())
        culprits: dict[str, int] = {}
        together: set[str] = set()
        for uid in sorted(workloads - {UNKNOWN_WORKLOAD}):
            partners = [ws - {uid} for _, ws in self._incidents if uid in ws]
            if len(partners) < self.threshold:
                continue
            common = frozenset.intersection(*partners)
            if common:
                together |= {uid} | (common - {UNKNOWN_WORKLOAD})
            else:
                culprits[uid] = len(partners)
        if culprits:
            self._incidents = deque(
                (t, ws) for t, ws in self._incidents if not ws.intersection(culprits)
            )
            together = set()
        return Verdict(culprits=culprits, together=tuple(sorted(together)))

    def involved(self, uid: str) -> int:
        """Faults within the window (not yet explained by a culprit) that involved ``uid``."""
        return sum(1 for _, ws in self._incidents if uid in ws)

    def repeat(self, count: int) -> bool:
        return self.threshold > 0 and count >= self.threshold


def _created(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")


def pick_to_separate(pods: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The pod to move away from pods that keep faulting together, or None.

    Only a pod with a controller is moved (its controller recreates it, elsewhere if the
    scheduler can; evicting a bare pod would delete it for good). Among those, the youngest
    (latest ``creationTimestamp``: the least work lost, and the long-running neighbour stays),
    then by namespace/name, so every agent picks the same one."""

    def key(pod: Mapping[str, Any]) -> tuple[str, str, str]:
        meta = pod.get("metadata") or {}
        return (_created(pod), str(meta.get("namespace", "")), str(meta.get("name", "")))

    owned = [p for p in pods if workload_of(p).kind != "Pod"]
    if not owned:
        return None
    newest = max(_created(p) for p in owned)
    return min((p for p in owned if _created(p) == newest), key=key)


# ---- the monitor --------------------------------------------------------------------------


class FaultKube(Protocol):
    """The Kubernetes calls the monitor makes (gpushare.kube.node.NodeKube implements them)."""

    def record_event(
        self, *, pod: PodInfo | None, reason: str, message: str, warning: bool
    ) -> None: ...

    def publish_node(
        self, *, annotations: Mapping[str, str], labels: Mapping[str, str | None]
    ) -> None: ...

    def node_annotations(self) -> dict[str, str]: ...

    def annotate_pod(
        self, *, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> None: ...


@dataclass
class FaultStats:
    incidents: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    """(gpu uuid, attributed yes|no) -> incidents."""
    clients: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    """(gpu uuid, role) -> clients, role faulting (named by the MPS server) | victim (another
    client torn down with it) | unattributed (torn down; the server named no client)."""
    detection_s: dict[str, float] = field(default_factory=dict)
    recovery_s: dict[str, float] = field(default_factory=dict)
    """GPU -> seconds from the last fault to its last affected client leaving the server."""
    lingering: int = 0
    """Affected clients that kept their broken context past the grace period."""
    evicted: int = 0
    evicted_lingering: int = 0
    separated: int = 0
    """Pods evicted (not marked exclusive) to separate workloads that keep faulting together."""


@dataclass(frozen=True)
class PodRef:
    """A pod an incident involves."""

    pid: int
    uid: str | None
    manifest: Mapping[str, Any] | None

    @property
    def key(self) -> str:
        meta = (self.manifest or {}).get("metadata") or {}
        return f"{meta.get('namespace', '?')}/{meta.get('name', '?')}" if self.manifest else "?"


def _pod_info(pod: Mapping[str, Any]) -> PodInfo:
    meta = pod.get("metadata") or {}
    return PodInfo(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        annotations=dict(meta.get("annotations") or {}),
        phase=str((pod.get("status") or {}).get("phase") or "Pending"),
    )


def _shares_gpu(pod: Mapping[str, Any]) -> bool:
    """True when the pod runs on a share of a GPU (through MPS), not on whole GPUs. A share is
    told by its request: a burstable pod's thread cap may be the whole GPU."""
    try:
        placement = parse_placement((pod.get("metadata") or {}).get("annotations") or {})
    except InvalidInputError:
        return True
    return placement is None or (
        len(placement.gpu_uuids) == 1 and placement.guaranteed_percent < SLICES_PER_GPU
    )


class FaultMonitor:
    """Follows every GPU's MPS logs and reacts to fatal client faults (see the module doc)."""

    def __init__(
        self,
        *,
        node_name: str,
        log_dirs: Callable[[], Mapping[str, Path]],
        pods: Callable[[], list[dict[str, Any]]],
        fresh_pods: Callable[[], list[dict[str, Any]]] | None,
        kube: FaultKube | None,
        resolver: PodResolver | Callable[[str, int], str | None],
        mps_check: Callable[[str], bool] | None = None,
        exclusive_after: int = 2,
        window_s: float = 3600.0,
        linger_after_s: float = 15.0,
        evict_lingering_after_s: float = 60.0,
        exclusive_ttl_s: float = 86400.0,
        settle_s: float = 0.2,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_name = node_name
        self.log_dirs = log_dirs
        self.pods = pods
        self.fresh_pods = fresh_pods
        self.kube = kube
        self._resolve = resolver.remember if isinstance(resolver, PodResolver) else resolver
        self.mps_check = mps_check
        self.offenders = RepeatOffenders(threshold=exclusive_after, window_s=window_s)
        self.linger_after_s = linger_after_s
        self.evict_lingering_after_s = evict_lingering_after_s
        self.exclusive_ttl_s = exclusive_ttl_s
        self.clock = clock
        self._settle_s = settle_s
        self.started = clock()
        self.stats = FaultStats()
        self.history: deque[FaultIncident] = deque(maxlen=100)
        self.exclusive: dict[str, ExclusiveWorkload] = {}
        self._detectors: dict[str, FaultDetector] = {}
        self._tails: dict[str, list[LogTail]] = {}
        self._linger_refs: dict[tuple[str, float], list[PodRef]] = {}
        self._reported: dict[tuple[str, float, int], str] = {}
        """(gpu, fault time, pid) -> what was done about a lingering client."""
        self._lock = threading.Lock()
        self._loaded = False
        self.separated: dict[str, str] = {}
        """Pod UID -> why it is moved away from pods it keeps faulting with (marked once)."""
        self.apart: dict[str, ExclusiveWorkload] = {}
        """Workload UID -> its separation (published as ``gpushare.io/separated-workloads``:
        the webhook keeps its new pods off ``gpu_uuid``)."""

    # --- the loop step -------------------------------------------------------------------

    def check(self) -> list[FaultIncident]:
        """Read new log lines of every GPU; handle incidents. Called every ~0.5 s."""
        with self._lock:
            self._load_exclusive()
            found: list[FaultIncident] = []
            settling = False
            for uuid, directory in self.log_dirs().items():
                found += self._read(uuid, directory)
                settling = settling or self._detectors[uuid].pending
            if settling:
                # A fault is written as a burst of lines within a millisecond or two: read the
                # rest of it now rather than one polling period later.
                time.sleep(self._settle_s)
                for uuid, directory in self.log_dirs().items():
                    found += self._read(uuid, directory)
            for incident in found:
                self._handle(incident)
            now = self.clock()
            for detector in self._detectors.values():
                for item in detector.recovered():
                    self._recovered(item)
                for item in detector.open:
                    self._lingering(item, now)
            return found

    def _read(self, uuid: str, directory: Path) -> list[FaultIncident]:
        now = self.clock()
        detector = self._detectors.get(uuid)
        if detector is None:
            detector = self._detectors[uuid] = FaultDetector(
                uuid, since=self.started, settle_s=self._settle_s
            )
            self._tails[uuid] = [LogTail(directory / name) for name in LOG_FILES]
        for _ in range(MAX_CHUNKS_PER_CHECK):
            lines = [
                parsed
                for tail in self._tails[uuid]
                for raw in tail.read()
                if (parsed := parse_log_line(raw)) is not None
            ]
            lines.sort(key=lambda ln: ln.at)
            for pid in detector.feed(lines, now=now):
                self._resolve(uuid, pid)
            if not any(tail.behind for tail in self._tails[uuid]):
                break
        return detector.incidents(now=now)

    # --- reactions -----------------------------------------------------------------------

    def _pods_by_uid(self, uids: set[str]) -> dict[str, Mapping[str, Any]]:
        def index(pods: list[dict[str, Any]]) -> dict[str, Mapping[str, Any]]:
            return {str((p.get("metadata") or {}).get("uid")): p for p in pods}

        known = index(self.pods())
        if not uids <= set(known) and self.fresh_pods is not None:
            try:
                known = index(self.fresh_pods())
            except Exception as exc:
                log.warning("could not list this node's pods: %s", exc)
        return known

    def refs(self, incident: FaultIncident) -> tuple[list[PodRef], list[PodRef]]:
        """(faulting, victims) as pods."""
        uids = {
            pid: self._resolve(incident.gpu_uuid, pid)
            for pid in (*incident.faulting_pids, *incident.victim_pids)
        }
        pods = self._pods_by_uid({u for u in uids.values() if u})

        def ref(pid: int) -> PodRef:
            uid = uids.get(pid)
            return PodRef(pid=pid, uid=uid, manifest=pods.get(uid) if uid else None)

        faulting = [ref(p) for p in incident.faulting_pids]
        blamed = {r.uid for r in faulting if r.uid}
        victims = [ref(p) for p in incident.victim_pids]
        # Another process of the faulting pod is not a victim of it.
        victims = [v for v in victims if not (v.uid and v.uid in blamed)]
        return faulting, victims

    def _plan(self) -> str:
        """What gpushare does about repeated faults, for the Events."""
        k, hours = self.offenders.threshold, self.offenders.window_s / 3600
        if k <= 0:
            return "gpushare moves no workload after faults (--exclusive-after-faults 0)."
        return (
            f"gpushare gives a workload a GPU of its own once it is involved in {k} such faults "
            f"within {hours:g} h beside different neighbours (the common factor), and moves one "
            "of a set of pods that keep faulting together to another GPU to tell them apart."
        )

    def _handle(self, incident: FaultIncident) -> None:
        self.history.append(incident)
        stats = self.stats
        stats.incidents[(incident.gpu_uuid, "yes" if incident.attributed else "no")] += 1
        stats.detection_s[incident.gpu_uuid] = incident.detection_s
        named, victims = self.refs(incident)
        by_server = ", ".join(f"{r.key} (process {r.pid})" for r in named) or "no client"
        involved = len(named) + len(victims)
        log.warning(
            "fatal GPU fault on %s: %d client(s) involved; the MPS server named %s",
            incident.gpu_uuid,
            involved,
            by_server,
            extra={"evidence": list(incident.evidence), "detection_s": incident.detection_s},
        )
        plan = self._plan()
        for ref in named:
            stats.clients[(incident.gpu_uuid, "faulting")] += 1
            self._event(
                ref,
                "GpuShareFault",
                f"the MPS server named process {ref.pid} of this pod as the client that hit a "
                f"fatal GPU error on shared GPU {incident.gpu_uuid}; {len(victims)} other "
                "client(s) were torn down with it. The naming is evidence, not proof: on an "
                "H200 with driver 580 it was the real faulter only about half the time. "
                f"{plan} Server log: " + " | ".join(incident.evidence[:2]),
            )
        role = "victim" if incident.attributed else "unattributed"
        for ref in victims:
            stats.clients[(incident.gpu_uuid, role)] += 1
            lost = (
                f"process {ref.pid} of this pod was involved in a fatal GPU fault on shared GPU "
                f"{incident.gpu_uuid} and lost its CUDA context (restartPolicy restarts the "
                "container). "
            )
            if incident.attributed:
                message = (
                    f"{lost}The MPS server named {by_server} as the client that hit the error, "
                    "which on an H200 with driver 580 was right only about half the time. "
                    f"{plan}"
                )
            else:
                message = (
                    f"{lost}The MPS server log named no client. {plan} Server log: "
                    + " | ".join(incident.evidence[:2])
                )
            self._event(ref, "GpuShareFaultVictim", message)
        self._event(
            None,
            "GpuShareFault",
            f"fatal GPU fault on {incident.gpu_uuid}: {involved} client(s) involved; "
            f"the MPS server named {by_server}",
        )
        if self.mps_check is not None:
            try:
                up = self.mps_check(incident.gpu_uuid)
            except Exception as exc:
                log.warning("MPS daemon check after the fault failed: %s", exc)
                up = False
            log.info(
                "MPS daemon of %s after the fault: %s", incident.gpu_uuid, "up" if up else "down"
            )
        self._judge(incident, [*named, *victims])

    def _event(self, ref: PodRef | None, reason: str, message: str) -> None:
        """A warning Event on the pod of ``ref``, or on the node when ``ref`` is None."""
        if self.kube is None or (ref is not None and ref.manifest is None):
            return
        pod = _pod_info(ref.manifest) if ref is not None and ref.manifest is not None else None
        try:
            self.kube.record_event(pod=pod, reason=reason, message=message, warning=True)
        except Exception as exc:
            where = ref.key if ref is not None else "the node"
            log.warning("could not record event %s on %s: %s", reason, where, exc)

    def _recovered(self, item: OpenIncident) -> None:
        incident = item.incident
        self._linger_refs.pop((incident.gpu_uuid, incident.logged_at), None)
        for key in [k for k in self._reported if k[:2] == (incident.gpu_uuid, incident.logged_at)]:
            del self._reported[key]
        if item.recovered_at is None:
            return
        seconds = max(0.0, item.recovered_at - incident.logged_at)
        self.stats.recovery_s[incident.gpu_uuid] = seconds
        log.info(
            "MPS server of %s takes new clients again: every client the fault reached has left "
            "(%.2f s after the fault)",
            incident.gpu_uuid,
            seconds,
        )

    def _lingering(self, item: OpenIncident, now: float) -> None:
        """Affected clients that keep their broken context block the GPU for every new client:
        tell their pod, then evict it."""
        age = now - item.incident.detected_at
        if age < self.linger_after_s or not item.remaining:
            return
        incident_key = (item.incident.gpu_uuid, item.incident.logged_at)
        refs = self._linger_refs.get(incident_key)
        if refs is None:  # resolved once, not on every check while it lingers
            faulting, victims = self.refs(item.incident)
            refs = self._linger_refs[incident_key] = [*faulting, *victims]
        for ref in refs:
            if ref.pid not in item.remaining:
                continue
            key = (item.incident.gpu_uuid, item.incident.logged_at, ref.pid)
            done = self._reported.get(key)
            if done is None:
                self._reported[key] = "told"
                self.stats.lingering += 1
                self._event(
                    ref,
                    "GpuShareBrokenClient",
                    f"process {ref.pid} of this pod still holds the CUDA context a fatal GPU fault "
                    f"broke {age:.0f}s ago on shared GPU {item.incident.gpu_uuid}; its MPS server "
                    "takes no new client (CUDA error 807) until it exits. Restart this pod"
                    + (
                        f"; gpushare evicts it after {self.evict_lingering_after_s:.0f}s."
                        if self.evict_lingering_after_s > 0
                        else "."
                    ),
                )
            elif (
                done == "told"
                and self.evict_lingering_after_s > 0
                and age >= self.evict_lingering_after_s
                and ref.manifest is not None
                and self.kube is not None
            ):
                self._reported[key] = "evicted"
                info = _pod_info(ref.manifest)
                reason = (
                    f"process {ref.pid} kept a CUDA context a fatal GPU fault broke on "
                    f"{item.incident.gpu_uuid} for {age:.0f}s, blocking the GPU for new pods"
                )
                try:
                    self.kube.annotate_pod(
                        namespace=info.namespace, name=info.name, annotations={ANN_EVICT: reason}
                    )
                    self.stats.evicted_lingering += 1
                    log.warning("asked the controller to evict %s: %s", info.key, reason)
                except Exception as exc:
                    log.warning("could not mark %s for eviction: %s", info.key, exc)

    # --- exclusive GPUs for repeat offenders ---------------------------------------------

    def _load_exclusive(self) -> None:
        if self._loaded or self.kube is None:
            return
        self._loaded = True
        try:
            annotations = self.kube.node_annotations()
        except Exception as exc:
            log.warning("could not read this node's annotations: %s", exc)
            return
        for key, load, into in (
            (ANN_NODE_EXCLUSIVE, load_exclusive, self.exclusive),
            (ANN_NODE_SEPARATED, load_separated, self.apart),
        ):
            try:
                text = annotations.get(key)
                if text:
                    into.update({w.uid: w for w in load(text)})
            except Exception as exc:
                log.warning("ignoring this node's %s: %s", key, exc)

    def _judge(self, incident: FaultIncident, refs: list[PodRef]) -> None:
        """Record the workloads the incident involved; move the culprit to a GPU of its own, or
        separate workloads that keep faulting together."""
        workloads: dict[str, list[PodRef]] = defaultdict(list)
        for ref in refs:
            uid = workload_of(ref.manifest).uid if ref.manifest is not None else ""
            workloads[uid or UNKNOWN_WORKLOAD].append(ref)
        verdict = self.offenders.record(workloads, incident.logged_at)
        for uid, count in verdict.culprits.items():
            for ref in workloads[uid]:
                self._mark_exclusive(ref, incident, count)
        if verdict.together:
            self._separate(incident, {uid: workloads[uid] for uid in verdict.together})

    def _mark_exclusive(self, ref: PodRef, incident: FaultIncident, count: int) -> None:
        assert ref.manifest is not None
        workload = workload_of(ref.manifest)
        mark = _mark(workload, incident, count)
        first = workload.uid not in self.exclusive
        self.exclusive[workload.uid] = mark
        if first:
            self._publish_exclusive()
        if not _shares_gpu(ref.manifest):
            return
        info = _pod_info(ref.manifest)
        recreate = (
            f"its {workload.kind} recreates it on a GPU of its own"
            if workload.kind != "Pod"
            else 'it has no controller: recreate it with gpushare.io/gpu-fraction: "1"'
        )
        self._event(
            ref,
            "GpuShareExclusiveGpu",
            f"{mark.reason}; evicting this pod from its shared GPU so it stops breaking its "
            f"neighbours; {recreate}",
        )
        if self.kube is None:
            return
        try:
            # The controller evicts it (it holds that right; this agent does not).
            self.kube.annotate_pod(
                namespace=info.namespace,
                name=info.name,
                annotations={ANN_EXCLUSIVE: mark.reason, ANN_EVICT: mark.reason},
            )
            self.stats.evicted += 1
        except Exception as exc:
            log.warning("could not move %s to an exclusive GPU: %s", info.key, exc)

    def _separate(self, incident: FaultIncident, together: Mapping[str, list[PodRef]]) -> None:
        """Evict one pod of workloads that keep faulting together (not marked exclusive): its
        controller recreates it, and the next fault, beside other neighbours, tells."""
        pods = {
            str((r.manifest.get("metadata") or {}).get("uid")): r
            for refs in together.values()
            for r in refs
            if r.manifest is not None and _shares_gpu(r.manifest)
        }
        labels = sorted(workload_of(r.manifest).label for r in pods.values() if r.manifest)
        count = max(self.offenders.involved(uid) for uid in together)
        window = f"{self.offenders.window_s / 3600:g} h"
        if pods.keys() & self.separated.keys():
            return  # one of them is already being moved
        chosen = pick_to_separate([r.manifest for r in pods.values() if r.manifest is not None])
        if chosen is None:
            for ref in pods.values():
                self._event(
                    ref,
                    "GpuShareFaultSeparate",
                    f"{', '.join(labels)} keep being involved in the same fatal GPU faults "
                    f"({count} within {window}, last on shared GPU {incident.gpu_uuid}), so "
                    "gpushare cannot tell which one "
                    "faults; none has a controller that would recreate it, so none is evicted: "
                    "recreate one of them on another GPU (or with gpushare.io/gpu-fraction: "
                    '"1").',
                )
            return
        ref = pods[str((chosen.get("metadata") or {}).get("uid"))]
        info = _pod_info(chosen)
        mine = workload_of(chosen).label
        others = ", ".join(label for label in labels if label != mine) or "nothing else"
        reason = (
            f"{mine} and {others} keep being involved in the same fatal GPU faults ({count} "
            f"within {window}, last on shared GPU {incident.gpu_uuid}), so which one faults "
            "cannot be told; this pod is "
            "moved (not to an exclusive GPU) so the next fault, beside other neighbours, tells"
        )
        self._event(
            ref, "GpuShareFaultSeparate", f"{reason}; evicting it, its controller recreates it"
        )
        self.separated[info.uid] = reason
        moved = workload_of(chosen)
        self.apart[moved.uid] = _mark(moved, incident, count)
        self._publish_exclusive()
        if self.kube is None:
            return
        try:
            self.kube.annotate_pod(
                namespace=info.namespace, name=info.name, annotations={ANN_EVICT: reason}
            )
            self.stats.separated += 1
            log.warning("asked the controller to evict %s: %s", info.key, reason)
        except Exception as exc:
            self.separated.pop(info.uid, None)
            log.warning("could not mark %s for eviction: %s", info.key, exc)

    def _publish_exclusive(self) -> None:
        """Publish the exclusive and the separated workloads (marks older than
        ``exclusive_ttl_s`` dropped)."""
        cutoff = self.clock() - self.exclusive_ttl_s
        for marks in (self.exclusive, self.apart):
            for uid, mark in list(marks.items()):
                try:
                    marked = datetime.fromisoformat(mark.since.replace("Z", "+00:00")).timestamp()
                except ValueError:
                    continue
                if marked < cutoff:
                    del marks[uid]
        if self.kube is None:
            return
        try:
            self.kube.publish_node(
                annotations={
                    ANN_NODE_EXCLUSIVE: dump_exclusive(list(self.exclusive.values())),
                    ANN_NODE_SEPARATED: dump_exclusive(list(self.apart.values())),
                },
                labels={},
            )
        except Exception as exc:
            log.warning(
                "could not publish %s and %s: %s", ANN_NODE_EXCLUSIVE, ANN_NODE_SEPARATED, exc
            )

    # --- metrics -------------------------------------------------------------------------

    def collector(self) -> Collector:
        return FaultCollector(monitor=self)


class FaultCollector(Collector):
    """``gpushare_mps_fault_*`` series of one node."""

    def __init__(self, *, monitor: FaultMonitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        m = self.monitor
        node = m.node_name
        incidents = CounterMetricFamily(
            "gpushare_mps_fault_incidents",
            "Fatal GPU faults of MPS clients seen in the MPS server logs; attributed=yes when "
            "the log named a client (evidence, not proof: on driver 580 the named client was "
            "the real faulter about half the time).",
            labels=["node", "gpu_uuid", "attributed"],
        )
        for (uuid, attributed), value in sorted(m.stats.incidents.items()):
            incidents.add_metric([node, uuid, attributed], float(value))
        yield incidents
        clients = CounterMetricFamily(
            "gpushare_mps_fault_clients",
            "MPS clients involved in fatal GPU faults (torn down by them), by role: faulting "
            "(named by the MPS server, right about half the time on driver 580), victim "
            "(another client torn down with it), unattributed (the log named no client).",
            labels=["node", "gpu_uuid", "role"],
        )
        for (uuid, role), value in sorted(m.stats.clients.items()):
            clients.add_metric([node, uuid, role], float(value))
        yield clients
        detection = GaugeMetricFamily(
            "gpushare_mps_fault_detection_seconds",
            "Time from the last fault being logged by the MPS server to the node agent acting.",
            labels=["node", "gpu_uuid"],
        )
        for uuid, seconds in sorted(m.stats.detection_s.items()):
            detection.add_metric([node, uuid], seconds)
        yield detection
        recovery = GaugeMetricFamily(
            "gpushare_mps_fault_recovery_seconds",
            "Time from the last fault to the last client it reached leaving the MPS server (the "
            "server takes new clients again).",
            labels=["node", "gpu_uuid"],
        )
        for uuid, seconds in sorted(m.stats.recovery_s.items()):
            recovery.add_metric([node, uuid], seconds)
        yield recovery
        exclusive = GaugeMetricFamily(
            "gpushare_exclusive_workloads",
            "Workloads this node marked for a GPU of their own: each involved in repeated faults "
            "whose other involved workloads had nothing in common.",
            labels=["node"],
        )
        exclusive.add_metric([node], float(len(m.exclusive)))
        yield exclusive
        for name, value, help_text in (
            (
                "gpushare_mps_fault_evictions",
                m.stats.evicted,
                "Pods evicted from a shared GPU to get one of their own.",
            ),
            (
                "gpushare_mps_fault_separations",
                m.stats.separated,
                "Pods evicted, not marked exclusive, to separate workloads that keep faulting "
                "together (which one faults cannot be told until they fault apart).",
            ),
            (
                "gpushare_mps_fault_lingering_clients",
                m.stats.lingering,
                "Clients a fault broke that kept their context past the grace period (they block "
                "the GPU's MPS server for new clients).",
            ),
            (
                "gpushare_mps_fault_lingering_evictions",
                m.stats.evicted_lingering,
                "Pods evicted because they kept a broken MPS client.",
            ),
        ):
            counter = CounterMetricFamily(name, help_text, labels=["node"])
            counter.add_metric([node], float(value))
            yield counter


__all__ = [
    "UNKNOWN_WORKLOAD",
    "FaultDetector",
    "FaultIncident",
    "FaultMonitor",
    "LogTail",
    "MpsLogLine",
    "PodResolver",
    "RepeatOffenders",
    "Verdict",
    "Workload",
    "classify",
    "is_fault_line",
    "parse_log_line",
    "pick_to_separate",
    "workload_of",
]
