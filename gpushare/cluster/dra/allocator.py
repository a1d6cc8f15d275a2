"""The controller's claim allocator: it places the gpushare claims of gated pods and lets the
pods go to kube-scheduler (docs/dra.md, "Who places a claim").

A pod carrying the scheduling gate ``gpushare.io/placement`` (the webhook adds it in DRA mode;
users may add it to pods with their own claims) is not scheduled until the gate is gone. For
each such pod the allocator, on the leader:

1. waits for its claims (kube-controller-manager makes template claims and records their names
   in the pod's status);
2. for each unallocated claim of the DeviceClass it serves, reads what it asks
   (gpushare.cluster.dra.placement.read_ask), asks the placer for a node and GPU, and writes the
   claim's finalizer and ``status.allocation`` (guarded by the claim's resourceVersion);
3. removes the gate. kube-scheduler then binds the pod to the node the allocation names.

A claim gpushare cannot read completely is left to kube-scheduler (the gate is removed without
an allocation). A claim that fits nowhere keeps its pod gated, with one warning event saying
why, and is tried again whenever a GPU or a share changes. Placements are made one at a time in
this process's event loop, so two of them never take the same room; a claim kube-scheduler
allocated meanwhile is counted from the claim watch (and the API server's resourceVersion check
refuses a claim written twice).
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpushare.api.dra import PLACEMENT_GATE
from gpushare.cluster.dra import placement
from gpushare.cluster.dra.devices import DraDevices
from gpushare.cluster.state.host_resources import pod_requests
from gpushare.cluster.state.view import ClusterView
from gpushare.kube.errors import KubeError
from gpushare.packing.placer import Placer

log = logging.getLogger(__name__)

CLASS_CONFIG_TTL_S = 60.0
"""How long the served DeviceClass's configs are reused before they are read again."""
RETRY_S = 2.0
"""A pod whose placement failed on an API error is tried again after this long."""


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
    ) -> dict[str, Any]: ...

    async def get_device_class(self, name: str) -> dict[str, Any] | None: ...

    async def remove_scheduling_gate(
        self, *, namespace: str, name: str, index: int, gate: str
    ) -> None: ...

    async def pod_event(
        self, *, pod: Mapping[str, Any], reason: str, message: str, warning: bool
    ) -> None: ...


@dataclass
class _Waiting:
    pod: Mapping[str, Any]
    refused_at: int | None = None
    """``DraDevices.version`` when no GPU had room (tried again once it moves)."""
    retry_at: float = 0.0
    told: str = ""
    """The last refusal the pod's event said (said once)."""
    claims: set[str] = field(default_factory=set)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def gate_index(pod: Mapping[str, Any]) -> int | None:
    """Where the pod's ``gpushare.io/placement`` gate is in ``spec.schedulingGates``."""
    spec = pod.get("spec")
    gates = spec.get("schedulingGates") if isinstance(spec, Mapping) else None
    for i, gate in enumerate(gates if isinstance(gates, list) else ()):
        if isinstance(gate, Mapping) and gate.get("name") == PLACEMENT_GATE:
            return i
    return None


class ClaimAllocator:
    """Places the claims of gated pods, one pod at a time (see the module docstring)."""

    def __init__(
        self,
        *,
        view: ClusterView,
        devices: DraDevices,
        placer: Placer,
        writer: ClaimWriter,
        device_class: str,
    ) -> None:
        self.view = view
        self.devices = devices
        self.placer = placer
        self.writer = writer
        self.device_class = device_class
        self._waiting: dict[str, _Waiting] = {}
        self._by_claim: dict[str, set[str]] = {}
        self._wake = asyncio.Event()
        self._in_flight: dict[str, tuple[str, int, int]] = {}
        """Pod key -> (node, milli-CPU, memory) of pods placed here and not yet bound."""
        self._class_configs: tuple[float, list[Mapping[str, Any]]] | None = None
        self.placed = 0
        self.left_to_scheduler = 0
        devices.listeners.append(self._claim_changed)

    # ---- events --------------------------------------------------------------------------

    def pod_event(self, pod: Mapping[str, Any]) -> None:
        """A pod as watched: kept while it is gated by us and not being deleted."""
        meta = _meta(pod)
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        spec = pod.get("spec")
        if isinstance(spec, Mapping) and spec.get("nodeName"):
            self._in_flight.pop(key, None)
        if gate_index(pod) is None or meta.get("deletionTimestamp"):
            self.pod_gone(key, deleted=bool(meta.get("deletionTimestamp")))
            return
        waiting = self._waiting.get(key)
        if waiting is None:
            self._waiting[key] = _Waiting(pod=pod)
        else:
            waiting.pod = pod
            waiting.retry_at = 0.0
        self._wake.set()

    def pod_gone(self, key: str, *, deleted: bool = False) -> None:
        """Stop waiting for pod ``key`` (ungated, or ``deleted``: then it holds no host room)."""
        waiting = self._waiting.pop(key, None)
        if waiting is not None:
            for claim in waiting.claims:
                self._by_claim.get(claim, set()).discard(key)
        if deleted:
            self._in_flight.pop(key, None)

    def pods_listed(self, pods: list[Mapping[str, Any]]) -> None:
        """A full list of pods: the gated ones are all there is to place."""
        seen = set()
        for pod in pods:
            meta = _meta(pod)
            seen.add(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
            self.pod_event(pod)
        for key in [k for k in {*self._waiting, *self._in_flight} if k not in seen]:
            self.pod_gone(key, deleted=True)

    def _claim_changed(self, claim_key: str) -> None:
        for key in self._by_claim.get(claim_key, ()):
            waiting = self._waiting.get(key)
            if waiting is not None:
                waiting.retry_at = 0.0
                waiting.refused_at = None
                self._wake.set()

    # ---- the loop ------------------------------------------------------------------------

    async def run(self, *, leading: asyncio.Event | None = None) -> None:
        """Place gated pods forever (on the leader, once the claim and slice watches and the
        view have listed)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=1.0)
            self._wake.clear()
            if (leading is not None and not leading.is_set()) or not (
                self.devices.synced and self.view.synced
            ):
                continue
            await self.place_ready()

    async def place_ready(self) -> int:
        """Try every waiting pod that may have a new answer; returns how many were tried."""
        now = time.monotonic()
        tried = 0
        for key in list(self._waiting):
            waiting = self._waiting.get(key)
            if waiting is None or waiting.retry_at > now:
                continue
            if waiting.refused_at is not None and waiting.refused_at == self.devices.version:
                continue
            tried += 1
            try:
                await self.place(key, waiting)
            except KubeError as exc:
                waiting.retry_at = time.monotonic() + RETRY_S
                log.warning(
                    "claim placement failed; retrying", extra={"pod": key, "error": str(exc)}
                )
            except Exception:
                waiting.retry_at = time.monotonic() + RETRY_S
                log.exception("claim placement failed; retrying", extra={"pod": key})
            await asyncio.sleep(0)
        return tried

    async def place(self, key: str, waiting: _Waiting) -> None:
        """Place the pod's unallocated gpushare claims, then remove its gate."""
        pod = waiting.pod
        namespace = key.partition("/")[0]
        claims: list[tuple[str, Mapping[str, Any]]] = []
        for pod_claim, claim_name in placement.pod_claim_names(pod):
            if claim_name is None:
                log.debug("claim not made yet", extra={"pod": key, "claim": pod_claim})
                return  # the pod's status update (claim made) wakes it again
            claim_key = f"{namespace}/{claim_name}"
            self._watch_claim(key, waiting, claim_key)
            claim = self.devices.claim(claim_key)
            if claim is None:
                return  # the claim watch has not seen it yet; its event wakes the pod
            claims.append((claim_key, claim))
        for claim_key, claim in claims:
            if (claim.get("status") or {}).get("allocation"):
                continue
            ask = placement.read_ask(claim, device_class=self.device_class)
            if isinstance(ask, str):
                self.left_to_scheduler += 1
                log.info(
                    "claim left to kube-scheduler",
                    extra={"pod": key, "claim": claim_key, "why": ask},
                )
                continue
            if not await self._allocate(key, waiting, claim_key, claim, ask):
                return
        await self._ungate(key, waiting)

    async def _allocate(
        self,
        key: str,
        waiting: _Waiting,
        claim_key: str,
        claim: Mapping[str, Any],
        ask: placement.ClaimAsk,
    ) -> bool:
        namespace = key.partition("/")[0]
        cpu, memory = pod_requests(waiting.pod)
        want = placement.demand(
            ask,
            cpu_milli=cpu,
            memory_bytes=memory,
            tenancy=self.view.tenancies.tenancy(namespace),
        )
        started = time.monotonic()
        choice = placement.choose(
            self.placer,
            self.devices,
            want,
            tenancy_of=self.view.tenancies.tenancy,
            host_free=self._host_free,
        )
        if not isinstance(choice, placement.Choice):
            waiting.refused_at = self.devices.version
            why = "; ".join(f"{n} node(s): {r}" for r, n in sorted(choice.items()))
            if why != waiting.told:
                waiting.told = why
                log.info("claim fits no GPU", extra={"pod": key, "claim": claim_key, "why": why})
                await self.writer.pod_event(
                    pod=waiting.pod,
                    reason="GpushareNoRoom",
                    message=f"claim {claim_key} fits no GPU yet: {why}"[:1000],
                    warning=True,
                )
            return False
        meta = _meta(claim)
        claim_ns, claim_name = claim_key.split("/", 1)
        version = str(meta.get("resourceVersion", ""))
        finalizers = [str(f) for f in meta.get("finalizers") or []]
        if placement.FINALIZER not in finalizers:
            protected = await self.writer.protect_claim(
                namespace=claim_ns,
                name=claim_name,
                resource_version=version,
                finalizers=[*finalizers, placement.FINALIZER],
            )
            version = str(_meta(protected).get("resourceVersion", ""))
        body = placement.allocation(
            claim, ask, choice, class_configs=await self._class_config_entries()
        )
        allocated = await self.writer.allocate_claim(
            namespace=claim_ns, name=claim_name, resource_version=version, allocation=body
        )
        self.devices.upsert_claim(allocated)  # counted now, before its watch event comes
        node = choice.assignment.node
        self._in_flight[key] = (node, want.cpu_milli, want.host_memory_bytes)
        self.placed += 1
        log.info(
            "claim placed",
            extra={
                "pod": key,
                "claim": claim_key,
                "node": node,
                "gpus": ",".join(f"{g.pool}/{g.device}" for g in choice.gpus),
                "percent": ask.percent,
                "decide_ms": round((time.monotonic() - started) * 1000, 2),
            },
        )
        return True

    async def _ungate(self, key: str, waiting: _Waiting) -> None:
        index = gate_index(waiting.pod)
        if index is not None:
            namespace, _, name = key.partition("/")
            await self.writer.remove_scheduling_gate(
                namespace=namespace, name=name, index=index, gate=PLACEMENT_GATE
            )
        self.pod_gone(key)

    def _watch_claim(self, key: str, waiting: _Waiting, claim_key: str) -> None:
        if claim_key not in waiting.claims:
            waiting.claims.add(claim_key)
            self._by_claim.setdefault(claim_key, set()).add(key)

    def _host_free(self, node: str) -> tuple[int, int] | None:
        free = self.view.host_free(node)
        if free is None:
            return None
        cpu, memory = free
        for where, c, m in self._in_flight.values():
            if where == node:
                cpu, memory = cpu - c, memory - m
        return cpu, memory

    async def _class_config_entries(self) -> list[Mapping[str, Any]]:
        """The served DeviceClass's ``spec.config`` entries (re-read every
        CLASS_CONFIG_TTL_S)."""
        now = time.monotonic()
        if self._class_configs is None or now - self._class_configs[0] > CLASS_CONFIG_TTL_S:
            obj = await self.writer.get_device_class(self.device_class)
            spec = obj.get("spec") if obj else None
            raw = spec.get("config") if isinstance(spec, Mapping) else None
            entries = [c for c in raw if isinstance(c, Mapping)] if isinstance(raw, list) else []
            self._class_configs = (now, entries)
        return self._class_configs[1]


__all__ = ["ClaimAllocator", "ClaimWriter", "gate_index"]
