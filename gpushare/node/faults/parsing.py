"""Parsing MPS daemon and server logs: one line to :class:`MpsLogLine`, what a line says
(a client connected or left, a fatal fault, a server gone), and which clients the lines of
one fault name as its cause and as the others it reached (:func:`classify`)."""

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

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


def exited_server(line: MpsLogLine) -> int | None:
    """The MPS server a ``Server <pid> exited`` line reports gone, or None."""
    ended = _SERVER_EXIT.search(line.message)
    return int(ended.group(1)) if ended else None


def destroys_context(line: MpsLogLine) -> bool:
    """The server dropped its broken GPU context: every affected client has gone."""
    return _CONTEXT_DESTROYED.search(line.message) is not None


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
