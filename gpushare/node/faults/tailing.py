"""Following a log file that grows, is truncated or is replaced, with bounded memory."""

from pathlib import Path

MAX_INITIAL_READ = 8 * 2**20
"""Bytes of an existing log read at start (to learn which clients are connected)."""
READ_CHUNK = 256 * 2**10
"""Bytes of a log read at once: however much was appended, memory stays bounded."""
MAX_LINE = 16 * 2**10
"""A longer line is no MPS log line: it is dropped, not buffered."""


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
