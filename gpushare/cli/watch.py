"""``--watch``: read again every ``--interval`` seconds and print the view when it changed.

Bounded: one read at a time, only the last rendering kept, and ``--watch-timeout`` ends it
after that many seconds (0: until Ctrl-C). On a terminal each change redraws the screen; in a
pipe changes follow one another (YAML as ``---`` documents, JSON as one document per change).
A failed read after the first is reported on stderr and retried at the next interval; Ctrl-C
ends the watch with exit status 0 and no traceback.
"""

import sys
import time
from collections.abc import Callable
from typing import TextIO

from gpushare.api.errors import InvalidInputError
from gpushare.cli.render import printable

CLEAR = "\x1b[H\x1b[2J"


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
                    if redraw:
                        out.write(CLEAR)
                    elif last is not None:
                        out.write(separator or "\n")
                    out.write(text)
                    out.flush()
                    last = text
            if deadline is not None and clock() + interval_s > deadline:
                return 0
            sleep(interval_s)
    except KeyboardInterrupt:
        out.write("\n")
        out.flush()
        return 0
