"""Incidents: one GPU's MPS log lines turned into :class:`FaultIncident` (who the server
named, who else the fault reached), each kept open until every client it reached has left
the server (its recovery)."""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from gpushare.node.faults.parsing import (
    MpsLogLine,
    classify,
    connected_pid,
    destroys_context,
    disconnected_pid,
    exited_server,
    is_fault_line,
)


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
    def involved_pids(self) -> tuple[int, ...]:
        """Every client the fault tore down: the real faulter is one of them."""
        return (*self.faulting_pids, *self.victim_pids)

    @property
    def detection_s(self) -> float:
        return max(0.0, self.detected_at - self.logged_at)


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
        ended = exited_server(line) if line.source == "Control" else None
        if ended is not None:
            for pid in self.clients.pop(ended, set()):
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
            if destroys_context(line):
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
