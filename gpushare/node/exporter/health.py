"""GPU health and XID counts, fed by whoever consumes the backend's health events.

``GpuBackend.wait_health_events`` hands each event to one caller; the node agent's health
loop (which also marks devices unhealthy for the kubelet) owns that call and passes every
event to ``HealthRecorder.record`` so the exporter counts them without a second consumer.
"""

import threading
from dataclasses import dataclass

from gpushare.node.gpu.backend import HealthEvent


@dataclass(frozen=True)
class GpuHealth:
    healthy: bool
    reason: str
    xid_errors: int
    last_xid: int | None


class HealthRecorder:
    """Thread-safe tally of health events per GPU."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: dict[str, GpuHealth] = {}

    def record(self, event: HealthEvent) -> None:
        with self._lock:
            old = self._state.get(event.uuid, GpuHealth(True, "", 0, None))
            xids = old.xid_errors + (1 if event.xid is not None else 0)
            last = event.xid if event.xid is not None else old.last_xid
            self._state[event.uuid] = GpuHealth(event.healthy, event.reason, xids, last)

    def get(self, uuid: str) -> GpuHealth:
        with self._lock:
            return self._state.get(uuid, GpuHealth(True, "", 0, None))
