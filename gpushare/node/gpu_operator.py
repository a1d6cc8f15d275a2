"""Driver upgrades and MIG changes by the GPU Operator: the node agent takes gpushare's pods and
MPS daemons off the node's GPUs when the operator's labels say the GPUs are about to change,
and comes back afterwards (docs/coexistence.md, "Driver upgrades and MIG changes").

The operator's upgrade controller deletes only the GPU pods it recognises (``nvidia.com/gpu*``
requests), and mig-manager waits only for its own operands and for DaemonSets selecting
``nvidia.com/gpu.deploy.client``: gpushare's pods (``gpushare.io/gpu-percent`` or a claim of
driver gpu.gpushare.io) and its MPS daemons would keep the driver busy. So, while
:func:`gpushare.api.gpu_operator.read_labels` finds a pause on the node:

1. every GPU of the agent is unhealthy, for the source ``gpu-operator`` (the kubelet stops
   handing out its devices, and the agent reads not ready: the node's ``gpushare.io/agent-ready``
   goes false, so nothing new is placed here);
2. each gpushare pod on the node is marked ``gpushare.io/evict`` (the controller evicts it
   through the Eviction API, PodDisruptionBudgets respected) and gets a Warning Event
   ``GpushareDrainedForGpuOperator`` naming the label: no running pod goes without one;
3. once none is left, the MPS daemons are stopped and the drain marker file says ``drained``
   (the chart's preStop hook waits for it before the agent's container stops, so the operator,
   which waits for the agent's pod, proceeds only then).

When the labels no longer ask, the daemons start again and the agent is ready. A label with a
value gpushare does not know is ignored with one log line per value; a failed read of the node
keeps the state as it was.
"""

import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from gpushare.api.gpu_operator import OperatorPause, read_labels
from gpushare.api.pod import PodInfo
from gpushare.node.core.health import DeviceHealth
from gpushare.node.core.pods import annotated_gpus

log = logging.getLogger(__name__)

DRAIN_MARKER = ".gpu-operator-drain"
"""File in the agent's MPS root: ``draining`` or ``drained`` while paused (the chart's preStop
hook, helm/gpushare/files/lifecycle.py, reads it); absent otherwise."""
REASON_DRAINED = "GpushareDrainedForGpuOperator"
REASON_PAUSED = "GpusharePausedForGpuOperator"
REASON_RESUMED = "GpushareResumedAfterGpuOperator"
HEALTH_SOURCE = "gpu-operator"
"""The GPU health source (gpushare.node.core.health) a pause marks every GPU unhealthy with."""

Event = Callable[[PodInfo | None, str, str, bool], None]
"""(pod or None for the node, reason, message, warning)."""


def gpu_pods(pods: Iterable[PodInfo], claimed: Iterable[str] = ()) -> list[PodInfo]:
    """Pods on the node that hold one of gpushare's GPUs: placed by gpushare (a GPU named in
    their placement, or slices asked for) or holding a prepared claim (``claimed``: pod keys);
    finished ones left out."""
    keys = set(claimed)
    return [
        p
        for p in pods
        if not p.finished and (annotated_gpus(p) or any(p.requested_slices) or p.key in keys)
    ]


class GpuOperatorDrain:
    """One node's response to the GPU Operator's pause labels; :meth:`step` runs periodically."""

    def __init__(
        self,
        *,
        node_labels: Callable[[], Mapping[str, str]],
        gpu_pods: Callable[[], list[PodInfo]],
        mark_for_eviction: Callable[[PodInfo, str], None],
        event: Event,
        stop_mps: Callable[[], object],
        start_mps: Callable[[], object],
        changed: Callable[[], None],
        marker_dir: Path | None = None,
        every_s: float = 2.0,
        health: DeviceHealth | None = None,
    ) -> None:
        self._labels = node_labels
        self._gpu_pods = gpu_pods
        self._mark = mark_for_eviction
        self._event = event
        self._stop_mps = stop_mps
        self._start_mps = start_mps
        self._changed = changed
        self.every_s = every_s
        """How often :meth:`step` is to run."""
        self._health = health
        self.marker = marker_dir / DRAIN_MARKER if marker_dir is not None else None
        self.pause: OperatorPause | None = None
        """The pause in effect; None when the agent works as usual."""
        self.drained = False
        self._marked: set[str] = set()
        self._told: set[tuple[str, str]] = set()
        self._write_marker(None)

    def not_ready_reason(self) -> str | None:
        if self.pause is None:
            return None
        state = "drained" if self.drained else "draining gpushare's pods"
        return f"paused for {self.pause.describe()}: {state}"

    def step(self) -> None:
        try:
            labels = self._labels()
        except Exception as exc:
            log.warning("could not read this node's labels for GPU Operator pauses: %s", exc)
            return
        reading = read_labels(labels)
        for label, value in reading.unexpected:
            if (label, value) not in self._told:
                self._told.add((label, value))
                log.warning(
                    "node label %s=%s is no value gpushare knows from the GPU Operator; ignored",
                    label,
                    value,
                )
        if reading.pause is not None:
            if self.pause is None:
                self._enter(reading.pause)
            self.pause = reading.pause
            self._drain()
        elif self.pause is not None:
            self._leave()

    def _enter(self, pause: OperatorPause) -> None:
        log.warning("paused for %s: draining gpushare's pods and MPS daemons", pause.describe())
        self.pause, self.drained = pause, False
        self._write_marker("draining")
        self._mark_gpus(f"paused for {pause.describe()}")
        self._changed()
        self._tell(
            None,
            REASON_PAUSED,
            f"paused for {pause.describe()}: gpushare's pods on this node are evicted and its "
            "MPS daemons stopped; nothing new is placed here until the label changes back",
            True,
        )

    def _drain(self) -> None:
        assert self.pause is not None
        try:
            pods = self._gpu_pods()
        except Exception as exc:
            log.warning("could not list this node's pods to drain them: %s", exc)
            return
        why = f"evicted for {self.pause.describe()}"
        for pod in pods:
            if pod.uid in self._marked:
                continue
            try:
                self._mark(pod, why)
            except Exception as exc:
                log.warning("could not mark pod %s for eviction: %s", pod.key, exc)
                continue
            self._marked.add(pod.uid)
            log.warning("pod %s %s", pod.key, why)
            self._tell(
                pod,
                REASON_DRAINED,
                f"{why}: the driver or the MIG layout of its GPU changes and no process may "
                "hold the GPU meanwhile; its controller recreates it elsewhere (a bare pod is "
                "not recreated)",
                True,
            )
        if pods or self.drained:
            return
        try:
            self._stop_mps()
        except Exception as exc:
            log.warning("could not stop the MPS daemons: %s", exc)
            return
        self.drained = True
        self._write_marker("drained")
        self._changed()
        log.warning("drained for %s: no gpushare pod or MPS daemon left", self.pause.describe())

    def _leave(self) -> None:
        assert self.pause is not None
        was = self.pause
        try:
            self._start_mps()
        except Exception as exc:
            log.warning("could not start the MPS daemons again: %s; retrying", exc)
            return
        self.pause, self.drained = None, False
        self._marked.clear()
        self._write_marker(None)
        self._mark_gpus(None)
        self._changed()
        log.info("%s is over: serving again", was.describe())
        self._tell(None, REASON_RESUMED, f"{was.describe()} is over: gpushare serves again", False)

    def _mark_gpus(self, problem: str | None) -> None:
        if self._health is not None:
            for uuid in self._health.uuids:
                self._health.set_problem(uuid, HEALTH_SOURCE, problem)

    def _tell(self, pod: PodInfo | None, reason: str, message: str, warning: bool) -> None:
        try:
            self._event(pod, reason, message, warning)
        except Exception as exc:
            log.warning("could not record event %s: %s", reason, exc)

    def _write_marker(self, state: str | None) -> None:
        if self.marker is None:
            return
        try:
            if state is None:
                self.marker.unlink(missing_ok=True)
            else:
                self.marker.parent.mkdir(parents=True, exist_ok=True)
                self.marker.write_text(state + "\n")
        except OSError as exc:
            log.warning("could not write the drain marker %s: %s", self.marker, exc)
