"""When the pause loop runs: at once when a pod of this node changes in a way that matters to
its pause (its request, its deletion, its containers), as a watch of the node's pods reports,
and every ``resync_s`` in any case; each pass on the pods read fresh from the API server, so a
pass never acts on an older view than the one before it (docs/node-agent.md, "Pausing a pod").

The watch only wakes the loop: the pass lists the pods itself. Without the watch (an API server
refusing it, a lost connection being reopened) the loop still runs every ``resync_s``.
"""

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, Protocol

from gpushare.api.names import ANN_PAUSE
from gpushare.api.pod import PodInfo, pod_info
from gpushare.node.pausing.freezer import Freezer
from gpushare.node.pausing.metrics import PauseCollector
from gpushare.node.pausing.pauser import Pauser, container_ids

log = logging.getLogger(__name__)

WATCH_RETRY_S: Final = (1.0, 30.0)
"""First and longest wait before a failed watch is opened again."""

PodWatch = Callable[[], Iterator[tuple[str, Mapping[str, Any]]]]
"""() -> (event type, pod manifest) of the node's pods, as long as the watch lasts."""


def _fingerprint(manifest: Mapping[str, Any]) -> tuple[object, ...]:
    """What of a pod the pause loop acts on: a change in it wakes the loop."""
    metadata = manifest.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    return (
        annotations.get(ANN_PAUSE),
        bool(metadata.get("deletionTimestamp")),
        tuple(container_ids(manifest)),
        (manifest.get("status") or {}).get("phase"),
    )


class PauseLoop:
    """Runs :meth:`Pauser.reconcile` on fresh pod lists, woken by ``watch``."""

    def __init__(
        self,
        *,
        pauser: Pauser,
        read_pods: Callable[[], list[PodInfo]],
        watch: PodWatch | None,
        resync_s: float,
    ) -> None:
        self.pauser = pauser
        self.read_pods = read_pods
        self.watch = watch
        self.resync_s = resync_s
        self.passes = 0
        self._wake = threading.Event()

    def collector(self, node_name: str) -> PauseCollector:
        """The loop's ``gpushare_pod_pause*`` series for the agent's /metrics."""
        return PauseCollector(node_name=node_name, stats=self.pauser.stats)

    def wake(self) -> None:
        self._wake.set()

    def run_once(self) -> None:
        """One pass: the node's pods read now, each brought to its request."""
        self._wake.clear()
        pods = self.read_pods()
        self.pauser.reconcile(pods)
        self.passes += 1

    def start(self, stop: threading.Event) -> threading.Thread:
        """Start the loop (and the watch that wakes it, a daemon thread left to end with the
        process: it blocks on the API server's stream); the loop's thread is returned."""
        if self.watch is not None:
            threading.Thread(
                target=self._follow, args=(stop,), name="pause-watch", daemon=True
            ).start()
        thread = threading.Thread(target=self._run, args=(stop,), name="pausing", daemon=True)
        thread.start()
        return thread

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.run_once()
            except Exception:
                log.exception("pause loop pass failed; trying again")
                stop.wait(1.0)
            self._wake.wait(self.resync_s)

    def _follow(self, stop: threading.Event) -> None:
        assert self.watch is not None
        seen: dict[str, tuple[object, ...]] = {}
        first, most = WATCH_RETRY_S
        wait = first
        while not stop.is_set():
            try:
                for event, manifest in self.watch():
                    if stop.is_set():
                        return
                    wait = first
                    uid = str((manifest.get("metadata") or {}).get("uid", ""))
                    if event == "DELETED":
                        seen.pop(uid, None)
                        continue
                    now = _fingerprint(manifest)
                    if seen.get(uid) != now:
                        seen[uid] = now
                        self.wake()
            except Exception as exc:
                log.warning("watch of this node's pods failed (%s); again in %.0f s", exc, wait)
            stop.wait(wait)
            wait = min(most, wait * 2)


class PauseSettings(Protocol):
    """What the pause loop takes of the agent's settings (gpushare.node.settings)."""

    @property
    def cgroup_root(self) -> Path: ...

    @property
    def pause_resync_s(self) -> float: ...


class ClaimHolder(Protocol):
    @property
    def pod(self) -> str: ...


class PreparedClaims(Protocol):
    """The DRA driver's prepared claims (gpushare.node.dra.driver.DraDriver)."""

    def prepared(self) -> Mapping[str, ClaimHolder]: ...


def pause_loop(
    kube: Any, settings: PauseSettings, *, dra: Callable[[], PreparedClaims | None]
) -> PauseLoop:
    """The node agent's pause loop: it freezes and thaws the pods gpushare placed on this node
    (placement annotations in device-plugin mode; in DRA mode those holding a claim the driver
    ``dra`` returns prepared) through the host's cgroup freezer under
    ``settings.cgroup_root``. ``kube`` is the agent's gpushare.kube.node.NodeKube: it reads the
    node's pods and, with its watch, wakes the loop; without a way to read pods, passes see
    none."""
    raw_pods = getattr(kube, "raw_node_pods", None)

    def read_pods() -> list[PodInfo]:
        return [pod_info(m) for m in raw_pods()] if raw_pods is not None else []

    def placed(pod: PodInfo) -> bool:
        driver = dra()
        if pod.placement is not None:
            return True
        return driver is not None and any(c.pod == pod.key for c in driver.prepared().values())

    return PauseLoop(
        pauser=Pauser(freezer=Freezer(settings.cgroup_root), kube=kube, placed=placed),
        read_pods=read_pods,
        watch=getattr(kube, "watch_node_pods", None),
        resync_s=settings.pause_resync_s,
    )
