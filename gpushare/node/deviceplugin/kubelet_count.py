"""Does the kubelet's admission count this plugin's devices yet?

The device plugin hands its device list to the kubelet's ListAndWatch stream; the kubelet
counts those devices as allocatable only once its stream reader has applied the list, a moment
later (longer on a loaded node). A pod admitted in between fails for good
(``UnexpectedAdmissionError: no healthy devices present``), and a bare pod is lost
(docs/reliability.md, "Node agent killed"). So readiness asks the kubelet's pod-resources API
(``GetAllocatableResources``, the view its admission uses) once per listing, before the agent
calls itself ready (docs/node-agent.md, "Readiness").

A node without the pod-resources socket, or a kubelet that does not answer it, gets no
verdict: readiness stays what it was without this check (logged once per error kind).
"""

import logging
from collections.abc import Callable, Hashable
from pathlib import Path

from gpushare.api.names import RESOURCE_GPU_PERCENT
from gpushare.node.deviceplugin.holdings import kubelet_allocatable

log = logging.getLogger(__name__)

TIMEOUT_S = 0.5
"""Longest one question to the kubelet may take (it answers in about a millisecond)."""

Count = Callable[..., int]


class KubeletCount:
    """``counted(listing)``: False while the kubelet counts none of ``resource``'s devices after
    the listing ``listing`` (any hashable naming one ListAndWatch stream's first list)."""

    def __init__(
        self,
        socket_path: Path | None,
        *,
        resource: str = RESOURCE_GPU_PERCENT,
        count: Count = kubelet_allocatable,
    ) -> None:
        self.socket_path = socket_path
        self.resource = resource
        self._count = count
        self._confirmed: Hashable | None = None
        self._told: set[str] = set()

    def counted(self, listing: Hashable) -> bool:
        """True once the kubelet counted the devices after ``listing`` (remembered until the
        next listing), or when it cannot be asked."""
        if listing == self._confirmed:
            return True
        if self.socket_path is None or not self.socket_path.exists():
            return True
        try:
            found = self._count(
                socket_path=self.socket_path, resource=self.resource, timeout_s=TIMEOUT_S
            )
        except Exception as exc:  # grpc.RpcError, or a socket that is not the kubelet's
            kind = type(exc).__name__
            if kind not in self._told:
                self._told.add(kind)
                log.warning(
                    "cannot ask the kubelet's pod-resources API whether it counts the devices; "
                    "readiness goes without it",
                    extra={"socket": str(self.socket_path), "error": f"{kind}: {exc}"},
                )
            return True
        if found > 0:
            self._confirmed = listing
            return True
        return False
