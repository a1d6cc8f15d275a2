"""List, then watch, one kind of object into callbacks, forever; one poison object never stops it.

The controller's view is fed this way (docs/scheduling.md, "The view"): a full list replaces
what the view holds, then watch events update it from the list's resourceVersion. A watch the
API server ends (its timeout, or a watcher it dropped for falling behind) is opened again from
the last version seen, as client-go's reflector does; on 410 Gone (that version is too old),
on any other error (after a backoff) and every resync period the kind is listed again. A list
of every pod costs the controller about a second of CPU at 10,000 pods, and the scale bench
saw two or three such relists in one phase: relisting on each dropped watch made a busy
controller slower still (docs/dra.md, "Known limits").
"""

import asyncio
import gc
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

from gpushare.kube.errors import GoneError
from gpushare.kube.retry import Backoff

log = logging.getLogger(__name__)

Objects = Iterable[Mapping[str, Any]]
Lister = Callable[[], Awaitable[tuple[list[dict[str, Any]], str]]]
Watcher = Callable[[str, int], AsyncIterator[tuple[str, dict[str, Any]]]]
"""(resourceVersion, timeout seconds) -> (event type, object) pairs."""

RELIST_BACKOFF = Backoff(first_s=0.5, most_s=10.0)
"""Waits before listing again after a failed list or watch (reset by a list that worked)."""
REWATCH_PAUSE_S = 0.5
"""Wait before watching again after a watch that ended without an event (no busy loop)."""
WATCH_SLICE_S = 0.0005
"""Longest stretch of watch events applied before other work gets the event loop. A watch
stream delivers events in bursts (all that arrived while the loop was busy), and the loop reads
a burst without pausing: an extender filter call then waited behind the whole burst, and
kube-scheduler's cycle with it (docs/scale.md)."""
POISON_LOG_EVERY = 100
"""One warning per this many objects a watch could not take in (after the first)."""
_poisoned: dict[str, int] = {}


def poisoned_events(kind: str) -> int:
    """Watch events of ``kind`` the view could not take in since the process began."""
    return _poisoned.get(kind, 0)


def apply_event(
    kind: str,
    event: str,
    data: Mapping[str, Any],
    *,
    upsert: Callable[[Mapping[str, Any]], object],
    delete: Callable[[Mapping[str, Any]], None],
) -> None:
    """Hand one watch event to the view. An object the view cannot take in (a bug: parsing is
    total) is logged and skipped, so one poison object never stops the watch: re-listing would
    meet it again and the watch would never run (docs/security.md)."""
    try:
        if event == "DELETED":
            delete(data)
        elif event in ("ADDED", "MODIFIED"):
            upsert(data)
    except Exception as exc:
        count = _poisoned[kind] = _poisoned.get(kind, 0) + 1
        if count == 1 or count % POISON_LOG_EVERY == 0:
            raw_meta = data.get("metadata")
            meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
            log.error(
                "watch event skipped: the view could not take the object in",
                extra={
                    "kind": kind,
                    "object": f"{meta.get('namespace', '')}/{meta.get('name', '')}",
                    "error": f"{type(exc).__name__}: {str(exc)[:200]}",
                    "skipped": count,
                },
            )


def _version_of(data: Mapping[str, Any]) -> str:
    meta = data.get("metadata")
    version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return version if isinstance(version, str) else ""


async def inform(
    kind: str,
    *,
    list_all: Lister,
    watch: Watcher,
    replace: Callable[[Objects], None],
    upsert: Callable[[Mapping[str, Any]], object],
    delete: Callable[[Mapping[str, Any]], None],
    resync_seconds: float,
) -> None:
    """List, then watch from the list's resourceVersion, again from the last version seen
    whenever the server ends the watch; re-list on 410 Gone, on any error (after a backoff)
    and every ``resync_seconds``. Never returns."""
    delays = RELIST_BACKOFF.delays()
    loop = asyncio.get_running_loop()
    while True:
        try:
            items, version = await list_all()
            replace(items)
            count = len(items)
            del items
            # The view is long-lived: keep the cyclic GC from rescanning it on every
            # collection (that showed as 10+ ms tails in extender latency).
            gc.collect()
            gc.freeze()
            log.info("listed", extra={"kind": kind, "count": count, "rv": version})
            delays = RELIST_BACKOFF.delays()
            async with asyncio.timeout(resync_seconds):
                deadline = loop.time() + resync_seconds
                while True:
                    events = 0
                    left = max(1, int(deadline - loop.time()))
                    pause_at = loop.time() + WATCH_SLICE_S
                    async for event, data in watch(version, left):
                        apply_event(kind, event, data, upsert=upsert, delete=delete)
                        version = _version_of(data) or version
                        events += 1
                        if loop.time() >= pause_at:
                            await asyncio.sleep(0)  # requests waiting meanwhile go first
                            pause_at = loop.time() + WATCH_SLICE_S
                    log.debug("watch ended; watching again", extra={"kind": kind, "rv": version})
                    if not events:
                        await asyncio.sleep(REWATCH_PAUSE_S)
        except TimeoutError:
            continue  # periodic re-list
        except asyncio.CancelledError:
            raise
        except GoneError:
            continue  # the version is too old: list again at once
        except Exception as exc:
            log.warning(
                "watch failed", extra={"kind": kind, "error": f"{type(exc).__name__}: {exc}"}
            )
            await asyncio.sleep(next(delays))
