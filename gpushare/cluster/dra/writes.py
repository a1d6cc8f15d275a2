"""The claim allocator's API writes: a claim's finalizer and allocation (guarded by its
resourceVersion), the wait for the claim watch to deliver them, the gate's removal that
pins the pod to its node, and the pod's events (docs/dra.md, "Who places a claim").
"""

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from gpushare.api.dra import ANN_DRA_GPU, PLACEMENT_GATE
from gpushare.api.names import ANN_SHARE
from gpushare.cluster.dra import placement
from gpushare.cluster.dra.devices import DraDevices
from gpushare.cluster.dra.pin import pin_ops
from gpushare.cluster.dra.waiting import Waiting, gate_index, meta
from gpushare.kube.errors import KubeError, NotFoundError, UnprocessableError

log = logging.getLogger(__name__)

MAX_WRITES = 64
"""Pods whose placement is being written at once (each: finalizer, allocation, gate)."""
WATCH_WAIT_S = 5.0
"""Longest wait for the claim watch to deliver an allocation before the gate goes anyway."""


class ClaimWriter(Protocol):
    """The API calls of the allocator (gpushare.kube.controller.Kube)."""

    async def protect_claim(
        self, *, namespace: str, name: str, resource_version: str, finalizers: list[str]
    ) -> dict[str, Any]: ...

    async def allocate_claim(
        self,
        *,
        namespace: str,
        name: str,
        resource_version: str,
        allocation: Mapping[str, Any],
        reserved_for: Sequence[Mapping[str, str]] = (),
    ) -> dict[str, Any]: ...

    async def get_device_class(self, name: str) -> dict[str, Any] | None: ...

    async def remove_scheduling_gate(
        self,
        *,
        namespace: str,
        name: str,
        index: int,
        gate: str,
        annotations: Mapping[str, str] | None = None,
        ops: Sequence[Mapping[str, Any]] = (),
    ) -> None: ...

    async def pod_event(
        self, *, pod: Mapping[str, Any], reason: str, message: str, warning: bool
    ) -> None: ...


class ClaimWrites:
    """The writes of pods' placements, MAX_WRITES pods at once (:attr:`slots`)."""

    def __init__(self, *, writer: ClaimWriter, devices: DraDevices) -> None:
        self.writer = writer
        self.devices = devices
        self.slots = asyncio.Semaphore(MAX_WRITES)
        self._seen: dict[str, tuple[int, asyncio.Event]] = {}
        """Claim key -> (resourceVersion of our allocation, set once the watch delivered it)."""

    async def allocate(
        self,
        claim_key: str,
        claim: Mapping[str, Any],
        body: Mapping[str, Any],
        pod: Mapping[str, Any],
    ) -> None:
        """Write the claim's finalizer (when missing), then its allocation ``body`` reserved
        for ``pod``."""
        claim_meta = meta(claim)
        namespace, name = claim_key.split("/", 1)
        version = str(claim_meta.get("resourceVersion", ""))
        finalizers = [str(f) for f in claim_meta.get("finalizers") or []]
        if placement.FINALIZER not in finalizers:
            protected = await self.writer.protect_claim(
                namespace=namespace,
                name=name,
                resource_version=version,
                finalizers=[*finalizers, placement.FINALIZER],
            )
            version = str(meta(protected).get("resourceVersion", ""))
        # Reserved for the pod in the same write: kube-scheduler then finds it reserved and
        # binds without writing the claim again (one API write fewer per pod; kube-controller-
        # manager keeps a gated pod's reservation, checked on the local cluster).
        pod_meta = meta(pod)
        uid = str(pod_meta.get("uid", ""))
        reserved = [{"resource": "pods", "name": str(pod_meta.get("name", "")), "uid": uid}]
        allocated = await self.writer.allocate_claim(
            namespace=namespace,
            name=name,
            resource_version=version,
            allocation=body,
            reserved_for=reserved if uid else (),
        )
        # Counted as assumed until the claim watch delivers this version (watched).
        written = str(meta(allocated).get("resourceVersion", ""))
        self._seen[claim_key] = (int(written) if written.isdigit() else 0, asyncio.Event())
        self.check_seen(claim_key)

    def check_seen(self, claim_key: str) -> None:
        """The claim changed in the watch: note when it shows our allocation."""
        seen = self._seen.get(claim_key)
        claim = self.devices.claim(claim_key)
        if seen is None or claim is None:
            return
        version = str(meta(claim).get("resourceVersion", ""))
        status = claim.get("status")
        allocated = isinstance(status, Mapping) and bool(status.get("allocation"))
        if allocated and version.isdigit() and int(version) >= seen[0]:
            seen[1].set()

    async def watched(self, claim_keys: list[str]) -> None:
        """Wait (at most WATCH_WAIT_S) until the claim watch delivered our allocations. The
        gate goes only then: kube-scheduler, whose claim watch is about as fast, would
        otherwise see the pod before the allocation, allocate the claim itself and fail its
        bind ("got allocated elsewhere in the meantime", then a retry with back-off; measured
        on the scale bench: 551 of 1,000 pods)."""
        events = [self._seen[k][1] for k in claim_keys if k in self._seen]
        try:
            if events:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        asyncio.gather(*(e.wait() for e in events)), timeout=WATCH_WAIT_S
                    )
        finally:
            for k in claim_keys:
                self._seen.pop(k, None)

    async def remove_gate(self, key: str, waiting: Waiting) -> None:
        """Remove pod ``key``'s gate, pinning it to the node its claims were placed on and
        recording the GPU its GpuShare's profiler reads; the pod is marked gone when it was
        deleted meanwhile."""
        index = gate_index(waiting.pod)
        if index is None:
            return
        namespace, _, name = key.partition("/")
        record = _gpu_record(waiting)
        pinned = pin_ops(waiting.pod, waiting.node) if waiting.node else []

        async def ungate(ops: Sequence[Mapping[str, Any]]) -> None:
            await self.writer.remove_scheduling_gate(
                namespace=namespace,
                name=name,
                index=index,
                gate=PLACEMENT_GATE,
                annotations=record or None,
                ops=ops,
            )

        try:
            try:
                await ungate(pinned)
            except UnprocessableError as exc:
                if not pinned:
                    raise
                # The pod's affinity changed since it was watched, or the API server would not
                # take the addition: the pin is only a hint for kube-scheduler, so go without.
                log.info("pod not pinned", extra={"pod": key, "error": str(exc)})
                await ungate(())
        except NotFoundError:
            waiting.gone = True  # deleted meanwhile: nothing left to do

    async def tell(
        self, pod: Mapping[str, Any], message: str, *, reason: str, warning: bool
    ) -> None:
        """Record ``message`` in an event on ``pod`` (a failure is logged, not raised)."""
        try:
            await self.writer.pod_event(
                pod=pod, reason=reason, message=message[:1000], warning=warning
            )
        except KubeError as exc:
            log.warning("event not recorded", extra={"error": str(exc)})


def _gpu_record(waiting: Waiting) -> dict[str, str]:
    """The annotation the gate's removal writes: a GpuShare pod placed on one GPU records it
    (``gpushare.io/dra-gpu``), the GPU its share's profiler reads if the share elects it."""
    annotations = meta(waiting.pod).get("annotations")
    if (
        isinstance(annotations, Mapping)
        and annotations.get(ANN_SHARE)
        and len(waiting.gpus) == 1
        and annotations.get(ANN_DRA_GPU) != waiting.gpus[0]
    ):
        return {ANN_DRA_GPU: waiting.gpus[0]}
    return {}


__all__ = ["MAX_WRITES", "WATCH_WAIT_S", "ClaimWriter", "ClaimWrites"]
