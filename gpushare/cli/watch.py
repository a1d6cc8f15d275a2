"""``--watch``: :func:`follow` prints the view on each change the API server's watch reports
(the real cluster); :func:`watch` reads again every ``--interval`` seconds instead (a reader
without a watch, as the tests inject).

Bounded: one read at a time, only the last rendering kept, and ``--watch-timeout`` ends it
after that many seconds (0: until Ctrl-C). On a terminal each change redraws the screen; in a
pipe changes follow one another (YAML as ``---`` documents, JSON as one document per change).
A failed read after the first is reported on stderr and retried at the next interval; Ctrl-C
ends the watch with exit status 0 and no traceback.
"""

import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO, TypeVar

from gpushare.api.errors import InvalidInputError
from gpushare.cli.render import printable

CLEAR = "\x1b[H\x1b[2J"
T = TypeVar("T")


def watch(
    render: Callable[[], str],
    *,
    interval_s: float,
    timeout_s: float,
    separator: str = "",
    out: TextIO | None = None,
    err: TextIO | None = None,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> int:
    """Print ``render()`` now and again whenever it changes; the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    clock = clock or time.monotonic
    sleep = sleep or time.sleep
    redraw = out.isatty() and not separator
    deadline = clock() + timeout_s if timeout_s > 0 else None
    last: str | None = None
    try:
        while True:
            try:
                text = render()
            except InvalidInputError as exc:
                if last is None:
                    raise
                print(
                    f"error: {printable(str(exc))} (retrying in {interval_s:g}s)",
                    file=err,
                    flush=True,
                )
            else:
                if text != last:
                    _show(text, last, out, redraw=redraw, separator=separator)
                    last = text
            if deadline is not None and clock() + interval_s > deadline:
                return 0
            sleep(interval_s)
    except KeyboardInterrupt:
        out.write("\n")
        out.flush()
        return 0


def follow(
    updates: Iterator[T | InvalidInputError],
    render: Callable[[T], str],
    *,
    refresh_s: float | None,
    timeout_s: float,
    separator: str = "",
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """``-w`` over the watch API: print ``render(update)`` for the first update and whenever a
    later one renders differently. ``updates`` (the cluster's snapshots, gpushare.kube.cli
    follow_cluster) is read on a thread of its own, so ``--watch-timeout`` and, with a live
    source, a re-render every ``refresh_s`` happen while no event comes. A failure before the
    first update ends the command; later ones are reported on stderr and the watch goes on."""
    out = out or sys.stdout
    err = err or sys.stderr
    redraw = out.isatty() and not separator
    inbox: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=1)
    threading.Thread(target=_pump, args=(updates, inbox), name="watch-updates", daemon=True).start()
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
    last_text: str | None = None
    current: Any = None
    try:
        while True:
            what, item = _next(inbox, refresh_s if current is not None else None, deadline)
            if what == "ended":
                return 0
            if what == "refresh":
                item = current  # rendered again: a live source may read differently now
            if what == "failed" or isinstance(item, InvalidInputError):
                if last_text is None:
                    raise item
                print(f"error: {printable(str(item))}", file=err, flush=True)
                continue
            current = item
            try:
                text = render(item)
            except InvalidInputError as exc:  # the live source failing
                if last_text is None:
                    raise
                print(f"error: {printable(str(exc))}", file=err, flush=True)
                continue
            if text != last_text:
                _show(text, last_text, out, redraw=redraw, separator=separator)
                last_text = text
    except KeyboardInterrupt:
        out.write("\n")
        out.flush()
        return 0


def _pump(updates: Iterator[Any], inbox: "queue.Queue[tuple[str, Any]]") -> None:
    """Move ``updates`` into ``inbox`` (on its own thread), then a failure, then the end."""
    try:
        for item in updates:
            inbox.put(("item", item))
    except InvalidInputError as exc:
        inbox.put(("failed", exc))
    except Exception as exc:  # the command reports it like any failed read
        inbox.put(("failed", InvalidInputError("cluster", str(exc), "check the cluster")))
    inbox.put(("ended", None))


def _next(
    inbox: "queue.Queue[tuple[str, Any]]", refresh_s: float | None, deadline: float | None
) -> tuple[str, Any]:
    """The next thing to do: an update, a failure or the end from ``inbox``; ``refresh``
    after ``refresh_s`` without one; ``ended`` at ``deadline``."""
    waits = [w for w in (refresh_s,) if w]
    if deadline is not None:
        waits.append(max(0.0, deadline - time.monotonic()))
    try:
        return inbox.get(timeout=min(waits) if waits else None)
    except queue.Empty:
        if deadline is not None and time.monotonic() >= deadline:
            return "ended", None
        return "refresh", None


def _show(text: str, last_text: str | None, out: TextIO, *, redraw: bool, separator: str) -> None:
    """Print a changed rendering: over the last one on a terminal, else after a separator."""
    if redraw:
        out.write(CLEAR)
    elif last_text is not None:
        out.write(separator or "\n")
    out.write(text)
    out.flush()
