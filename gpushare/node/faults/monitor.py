"""The fault monitor of the node agent: follows every GPU's MPS logs, turns fault lines into
incidents, tells the pods involved, follows each GPU's recovery (evicting a pod that keeps a
broken client) and has the verdicts acted on."""

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path

from prometheus_client.registry import Collector

from gpushare.api.exclusive import ExclusiveWorkload
from gpushare.api.pod import PodInfo
from gpushare.node.faults.actions import (
    FaultKube,
    PodRef,
    WorkloadMoves,
    mark_for_eviction,
    warning_event,
)
from gpushare.node.faults.incidents import FaultDetector, FaultIncident, OpenIncident
from gpushare.node.faults.metrics import FaultCollector, FaultStats
from gpushare.node.faults.parsing import parse_log_line
from gpushare.node.faults.procfs import PodResolver
from gpushare.node.faults.tailing import LogTail
from gpushare.node.faults.verdicts import RepeatOffenders

# The package's one logger: its lines keep the name they have always had.
log = logging.getLogger("gpushare.node.faults")

LOG_FILES = ("server.log", "control.log")
MAX_CHUNKS_PER_CHECK = 32
"""Chunks of one log taken in per check (8 MiB): a flood is read over several checks."""


class FaultMonitor:
    """Follows every GPU's MPS logs and reacts to fatal client faults (see the package doc,
    :mod:`gpushare.node.faults`)."""

    def __init__(
        self,
        *,
        node_name: str,
        log_dirs: Callable[[], Mapping[str, Path]],
        pods: Callable[[], list[PodInfo]],
        fresh_pods: Callable[[], list[PodInfo]] | None,
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
        self.clock = clock
        self._settle_s = settle_s
        self.started = clock()
        self.stats = FaultStats()
        self.moves = WorkloadMoves(
            kube=kube,
            offenders=self.offenders,
            stats=self.stats,
            clock=clock,
            exclusive_ttl_s=exclusive_ttl_s,
        )
        self.history: deque[FaultIncident] = deque(maxlen=100)
        self._detectors: dict[str, FaultDetector] = {}
        self._tails: dict[str, list[LogTail]] = {}
        self._linger_refs: dict[tuple[str, float], list[PodRef]] = {}
        self._reported: dict[tuple[str, float, int], str] = {}
        """(gpu, fault time, pid) -> what was done about a lingering client."""
        self._lock = threading.Lock()

    @property
    def exclusive(self) -> dict[str, ExclusiveWorkload]:
        """Workload UID -> its mark for a GPU of its own."""
        return self.moves.exclusive

    @property
    def separated(self) -> dict[str, str]:
        """Pod UID -> why it is moved away from pods it keeps faulting with."""
        return self.moves.separated

    @property
    def apart(self) -> dict[str, ExclusiveWorkload]:
        """Workload UID -> its separation (``gpushare.io/separated-workloads``)."""
        return self.moves.apart

    # --- the loop step -------------------------------------------------------------------

    def check(self) -> list[FaultIncident]:
        """Read new log lines of every GPU; handle incidents. Called every ~0.5 s."""
        with self._lock:
            self.moves.load()
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

    def _pods_by_uid(self, uids: set[str]) -> dict[str, PodInfo]:
        def index(pods: list[PodInfo]) -> dict[str, PodInfo]:
            return {p.uid: p for p in pods}

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
            return PodRef(pid=pid, uid=uid, pod=pods.get(uid) if uid else None)

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
        """Count a fault, tell each pod involved and the node what happened, check the GPU's
        MPS daemon and let the moves judge whether to separate workloads."""
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
            warning_event(
                self.kube,
                ref,
                "GpuShareFault",
                f"the MPS server named process {ref.pid} of this pod as the client that hit a "
                f"fatal GPU error on shared GPU {incident.gpu_uuid}; {len(victims)} other "
                "client(s) were torn down with it. The naming is evidence, not proof: on an "
                "H200 with driver 580 it was the real faulter only about half the time. "
                f"{plan} Server log: " + " | ".join(incident.evidence[:2]),
            )
        self._warn_victims(incident, victims, by_server, plan)
        warning_event(
            self.kube,
            None,
            "GpuShareFault",
            f"fatal GPU fault on {incident.gpu_uuid}: {involved} client(s) involved; "
            f"the MPS server named {by_server}",
        )
        self._check_daemon(incident)
        self.moves.judge(incident, [*named, *victims])

    def _warn_victims(
        self, incident: FaultIncident, victims: list[PodRef], by_server: str, plan: str
    ) -> None:
        """Count each client the fault tore down that the server did not name, and put a
        Warning Event on its pod."""
        role = "victim" if incident.attributed else "unattributed"
        for ref in victims:
            self.stats.clients[(incident.gpu_uuid, role)] += 1
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
            warning_event(self.kube, ref, "GpuShareFaultVictim", message)

    def _check_daemon(self, incident: FaultIncident) -> None:
        """Log whether the GPU's MPS daemon survived the fault (a failed check counts as down)."""
        if self.mps_check is not None:
            try:
                up = self.mps_check(incident.gpu_uuid)
            except Exception as exc:
                log.warning("MPS daemon check after the fault failed: %s", exc)
                up = False
            log.info(
                "MPS daemon of %s after the fault: %s", incident.gpu_uuid, "up" if up else "down"
            )

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
                warning_event(
                    self.kube,
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
                and ref.pod is not None
                and self.kube is not None
            ):
                self._reported[key] = "evicted"
                info = ref.pod
                reason = (
                    f"process {ref.pid} kept a CUDA context a fatal GPU fault broke on "
                    f"{item.incident.gpu_uuid} for {age:.0f}s, blocking the GPU for new pods"
                )
                if mark_for_eviction(self.kube, info, reason):
                    self.stats.evicted_lingering += 1

    # --- metrics -------------------------------------------------------------------------

    def collector(self) -> Collector:
        return FaultCollector(
            node_name=self.node_name, stats=self.stats, exclusive=self.moves.exclusive
        )
