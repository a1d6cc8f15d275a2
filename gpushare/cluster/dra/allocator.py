"""The controller's claim allocator: it places the gpushare claims of gated pods and lets the
pods go to kube-scheduler (docs/dra.md, "Who places a claim").

A pod carrying the scheduling gate ``gpushare.io/placement`` (the webhook adds it in DRA mode;
users may add it to pods with their own claims) is not scheduled until the gate is gone. For
each such pod the allocator, on the leader:

1. waits for its claims (kube-controller-manager makes template claims and records their names
   in the pod's status);
2. for each unallocated claim of the DeviceClass it serves, reads what it asks
   (gpushare.cluster.dra.placement.read_ask), decides its node and GPU
   (gpushare.cluster.dra.decision) and writes the claim's finalizer and ``status.allocation``
   (guarded by the claim's resourceVersion; gpushare.cluster.dra.writes);
3. removes the gate. kube-scheduler then binds the pod to the node the allocation names.

A claim gpushare cannot read completely is left to kube-scheduler (the gate is removed without
an allocation). A claim that fits nowhere keeps its pod gated, with one warning event saying
why, and is tried again whenever a GPU or a share changes. Decisions are made one at a time in
this process's event loop and each is counted in the ledger before its writes go out (the
writes of up to MAX_WRITES pods run at once, :meth:`DraDevices.assume`), so two decisions never
take the same room; a claim kube-scheduler allocated meanwhile is counted from the claim watch,
and the API server's resourceVersion check refuses a claim written twice.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.cluster.dra import placement
from gpushare.cluster.dra.decision import ClaimDecider
from gpushare.cluster.dra.devices import DraDevices
from gpushare.cluster.dra.pod_rules import PodRules, avoid_gpus
from gpushare.cluster.dra.waiting import HostHolds, Waiting, gate_index, meta, other_gates
from gpushare.cluster.dra.writes import ClaimWriter, ClaimWrites
from gpushare.cluster.state.share_rules import ShareRules
from gpushare.cluster.state.view import ClusterView
from gpushare.kube.errors import KubeError, UnprocessableError
from gpushare.packing.placer import Placer

log = logging.getLogger(__name__)

CLASS_CONFIG_TTL_S = 60.0
"""How long the served DeviceClass's configs are reused before they are read again."""
RETRY_S = 2.0
"""A pod whose placement failed on an API error is tried again after this long."""
YIELD_EVERY = 16
"""Decisions made before the loop lets writes and watch events in."""
NO_ROOM_REASON = "GpushareNoRoom"
"""The reason of the warning event on a pod whose claim fits no GPU yet."""
HELD_REASON = "GpushareHeld"
"""The reason of the event on a pod its GpuShare holds (electing or profiling another pod),
or whose GpuShare annotations cannot be read."""
HOLD_RECHECK_S = 2.0
"""How often a held pod's GpuShare is looked at again (its status changes come through no
pod event)."""

_Claims = list[tuple[str, Mapping[str, Any]]]
"""(claim key, claim) of a pod's claims."""
_Plans = list[tuple[str, Mapping[str, Any], dict[str, Any]]]
"""(claim key, claim, allocation) of the claims decided for a pod, to be written."""


class ClaimAllocator:
    """Places the claims of gated pods (see the module docstring)."""

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
        self._waiting: dict[str, Waiting] = {}
        self._by_claim: dict[str, set[str]] = {}
        self._wake = asyncio.Event()
        self._hosts = HostHolds()
        self._rules = PodRules(view=view, devices=devices)
        self._decider = ClaimDecider(view=view, devices=devices, placer=placer, hosts=self._hosts)
        self._writes = ClaimWrites(writer=writer, devices=devices)
        self._class_configs: tuple[float, list[Mapping[str, Any]]] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.placed = 0
        self.left_to_scheduler = 0
        devices.listeners.append(self._claim_changed)

    # ---- events --------------------------------------------------------------------------

    def pod_event(self, pod: Mapping[str, Any]) -> None:
        """A pod as watched: kept while it is gated by us and not being deleted; the GpuShare
        rules of any pod with claims go to the ledger, so its claims' tenants carry them."""
        pod_meta = meta(pod)
        key = f"{pod_meta.get('namespace', '')}/{pod_meta.get('name', '')}"
        self._rules.note(key, pod)
        spec = pod.get("spec")
        if isinstance(spec, Mapping) and spec.get("nodeName"):
            self._hosts.release(key)  # bound: the view counts its requests now
        if gate_index(pod) is None or pod_meta.get("deletionTimestamp"):
            self.pod_gone(key, deleted=bool(pod_meta.get("deletionTimestamp")))
            return
        waiting = self._waiting.get(key)
        if waiting is None:
            self._waiting[key] = Waiting(pod=pod)
        else:
            waiting.pod = pod
            waiting.retry_at = 0.0
        self._wake.set()

    def waiting_pods(self) -> list[str]:
        """Keys of the gated pods waiting for their claims to be placed (metrics: pending);
        a pod another scheduling gate still holds waits for its queue, not for a GPU."""
        return [k for k, w in self._waiting.items() if not w.gone and not other_gates(w.pod)]

    def pod_gone(self, key: str, *, deleted: bool = False) -> None:
        """Stop waiting for pod ``key`` (ungated, or ``deleted``: then it holds no host room)."""
        waiting = self._waiting.get(key)
        if waiting is not None and waiting.writing:
            waiting.gone = True  # _write drops it when it ends
        elif waiting is not None:
            del self._waiting[key]
            for claim in waiting.claims:
                self._by_claim.get(claim, set()).discard(key)
        if deleted:
            self._hosts.release(key)
            self._rules.drop(key)

    def pods_listed(self, pods: list[Mapping[str, Any]]) -> None:
        """A full list of pods: the gated ones are all there is to place."""
        seen = set()
        for pod in pods:
            pod_meta = meta(pod)
            seen.add(f"{pod_meta.get('namespace', '')}/{pod_meta.get('name', '')}")
            self.devices.quarantine.take("Pod", pod, self.pod_event)
        known = {*self._waiting, *self._hosts.pods(), *self._rules.pods()}
        for key in [k for k in known if k not in seen]:
            self.pod_gone(key, deleted=True)

    def _claim_changed(self, claim_key: str) -> None:
        self._writes.check_seen(claim_key)
        for key in self._by_claim.get(claim_key, ()):
            waiting = self._waiting.get(key)
            if waiting is not None:
                waiting.retry_at = 0.0
                waiting.refused_at = None
                self._wake.set()

    # ---- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Place gated pods forever (run on the leader), once the claim and slice watches and
        the view have listed."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=1.0)
            self._wake.clear()
            if not (self.devices.synced and self.view.synced):
                continue
            try:
                await self.refresh_class_configs()
            except KubeError as exc:
                log.warning("DeviceClass unreadable; retrying", extra={"error": str(exc)})
                continue
            await self.place_ready()

    def _refusal_state(self) -> tuple[int, int]:
        """What a refusal was decided against: the GPUs and claims, and which nodes' agents
        are gone (a pod refused then is tried again when either moves)."""
        return self.devices.version, self.view.agents.generation

    async def place_ready(self) -> int:
        """Decide for every waiting pod that may have a new answer (their API writes run in
        the background, MAX_WRITES at once); returns how many were decided."""
        now = time.monotonic()
        tried = 0
        for key in list(self._waiting):
            waiting = self._waiting.get(key)
            if waiting is None or waiting.writing or waiting.retry_at > now:
                continue
            if waiting.refused_at is not None and waiting.refused_at == self._refusal_state():
                continue
            tried += 1
            try:
                self.place(key, waiting)
            except Exception:
                waiting.retry_at = time.monotonic() + RETRY_S
                log.exception("claim placement failed; retrying", extra={"pod": key})
            if tried % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # let the writes and the watches run
        return tried

    async def settle(self) -> None:
        """Wait for the API writes in flight (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # ---- one pod's placement -------------------------------------------------------------

    def place(self, key: str, waiting: Waiting) -> None:
        """Decide the pod's unallocated gpushare claims and count them at once; the writes
        (finalizer, allocation, then the gate's removal) go on in a task of their own."""
        rules = self._admitted(key, waiting)
        if rules is None:
            return
        claims = self._claims_of(key, waiting)
        if claims is None:
            return
        plans = self._plan(key, waiting, self._open_claims(key, claims), rules)
        if plans is None:
            return
        waiting.writing = True
        self._spawn(self._write(key, waiting, plans))

    def _admitted(self, key: str, waiting: Waiting) -> ShareRules | None:
        """The pod's GpuShare rules when it may be placed now (its GPUs to avoid read too);
        None while it stays gated: another scheduling gate is still on (a queue has not
        admitted it), its GpuShare holds it (electing or profiling another pod) or an
        annotation cannot be read. Its event says why; looked at again after
        HOLD_RECHECK_S, since a share's status changes come through no pod event."""
        others = other_gates(waiting.pod)
        if others:
            # Removing a gate is a pod update, which wakes the pod at once.
            gates = ", ".join(others)
            self._held(key, waiting, f"waits for its other scheduling gates to go: {gates}",
                       warning=False)  # fmt: skip
            return None
        rules = self._rules.of(key, waiting.pod)
        if isinstance(rules, str):
            self._held(key, waiting, rules, warning=True)
            return None
        why = self._rules.hold(rules)
        if why is not None:
            self._held(key, waiting, why, warning=False)
            return None
        try:
            waiting.avoid = avoid_gpus(waiting.pod)
        except InvalidInputError as exc:
            self._held(key, waiting, str(exc), warning=True)
            return None
        return rules

    def _held(self, key: str, waiting: Waiting, why: str, *, warning: bool) -> None:
        """Keep the pod gated for ``why`` (said in a HELD_REASON event) until HOLD_RECHECK_S."""
        waiting.retry_at = time.monotonic() + HOLD_RECHECK_S
        self._say(key, waiting, why, reason=HELD_REASON, warning=warning)

    def _claims_of(self, key: str, waiting: Waiting) -> _Claims | None:
        """The pod's claims as the claim watch has them, each noted as the pod's (a change to
        one wakes it); None while one is not made or not seen yet (its event wakes the pod)."""
        namespace = key.partition("/")[0]
        claims: _Claims = []
        for pod_claim, claim_name in placement.pod_claim_names(waiting.pod):
            if claim_name is None:
                log.debug("claim not made yet", extra={"pod": key, "claim": pod_claim})
                return None  # the pod's status update (claim made) wakes it again
            claim_key = f"{namespace}/{claim_name}"
            if claim_key not in waiting.claims:
                waiting.claims.add(claim_key)
                self._by_claim.setdefault(claim_key, set()).add(key)
            claim = self.devices.claim(claim_key)
            if claim is None:
                return None  # the claim watch has not seen it yet; its event wakes the pod
            claims.append((claim_key, claim))
        return claims

    def _open_claims(self, key: str, claims: _Claims) -> _Claims:
        """The claims still to place: not allocated and not counted as assumed. A pod with
        several is left to kube-scheduler: each allocation names a node, placing them one by
        one could name two and the pod would fit nowhere, while kube-scheduler allocates a
        pod's claims together."""
        open_claims = [
            (claim_key, claim)
            for claim_key, claim in claims
            if not (claim.get("status") or {}).get("allocation")
            and not self.devices.assumed(claim_key)
        ]
        if len(open_claims) <= 1:
            return open_claims
        self.left_to_scheduler += len(open_claims)
        log.info(
            "claims left to kube-scheduler",
            extra={"pod": key, "why": f"the pod has {len(open_claims)} unallocated claims"},
        )
        return []

    def _plan(
        self, key: str, waiting: Waiting, open_claims: _Claims, rules: ShareRules
    ) -> _Plans | None:
        """Decide each open claim gpushare can read (one it cannot is left to kube-scheduler);
        None when one fits no GPU: the pod's event says why, the claims decided before it
        stop counting and the pod's host room is let go."""
        plans: _Plans = []
        waiting.gpus, waiting.node = (), None
        for claim_key, claim in open_claims:
            ask = placement.read_ask(
                claim, device_class=self.device_class, class_configs=self._configs()
            )
            if isinstance(ask, str):
                self.left_to_scheduler += 1
                log.info(
                    "claim left to kube-scheduler",
                    extra={"pod": key, "claim": claim_key, "why": ask},
                )
                continue
            body = self._decider.decide(
                key, waiting, claim_key, claim, ask, rules=rules, class_configs=self._configs()
            )
            if isinstance(body, str):
                waiting.refused_at = self._refusal_state()
                self._say(key, waiting, body)
                for assumed, _, _ in plans:
                    self.devices.forget_assumed(assumed)
                self._hosts.release(key)
                return None
            plans.append((claim_key, claim, body))
        return plans

    # ---- the writes ----------------------------------------------------------------------

    async def _write(self, key: str, waiting: Waiting, plans: _Plans) -> None:
        """The API writes of one pod's placement; on a failure the unwritten allocations stop
        counting and the pod is tried again after RETRY_S (unless it is gone)."""
        written = 0
        refused: KubeError | None = None
        try:
            async with self._writes.slots:
                for claim_key, claim, body in plans:
                    try:
                        await self._writes.allocate(claim_key, claim, body, waiting.pod)
                    except UnprocessableError as exc:
                        refused = exc  # the API server will not take this write: see below
                        break
                    written += 1
                    self.placed += 1
                if refused is not None:
                    self._give_up(key, plans[written:], refused)
            await self._writes.watched([claim_key for claim_key, _, _ in plans[:written]])
            await self._writes.remove_gate(key, waiting)
        except Exception as exc:
            for claim_key, _, _ in plans[written:]:
                self.devices.forget_assumed(claim_key)
            if written < len(plans):
                self._hosts.release(key)
            waiting.writing = False
            if waiting.gone:
                self.pod_gone(key)
                return
            waiting.retry_at = time.monotonic() + RETRY_S
            log.warning("claim placement failed; retrying", extra={"pod": key, "error": str(exc)})
            return
        waiting.writing = False
        self.pod_gone(key)

    def _give_up(self, key: str, unwritten: _Plans, exc: KubeError) -> None:
        """The API server refused a claim's finalizer or allocation as invalid (422): a claim
        gpushare cannot write (e.g. one whose opaque parameters were stored with spaces, which
        any re-encoding changes). kube-scheduler, which writes claims without re-encoding
        them, places it instead: the gate is removed without an allocation."""
        for claim_key, _, _ in unwritten:
            self.devices.forget_assumed(claim_key)
        self._hosts.release(key)
        self.left_to_scheduler += len(unwritten)
        log.warning(
            "claim left to kube-scheduler: the API server refused gpushare's write",
            extra={"pod": key, "claim": unwritten[0][0], "error": str(exc)},
        )

    def _say(
        self,
        key: str,
        waiting: Waiting,
        why: str,
        *,
        reason: str = NO_ROOM_REASON,
        warning: bool = True,
    ) -> None:
        """Log why the pod waits and record it in one event, once per distinct reason."""
        if why == waiting.told:
            return
        waiting.told = why
        log.info("pod waits gated", extra={"pod": key, "why": why})
        self._spawn(self._writes.tell(waiting.pod, why, reason=reason, warning=warning))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- the DeviceClass -----------------------------------------------------------------

    def _configs(self) -> Sequence[Mapping[str, Any]]:
        """The served DeviceClass's configs as last read (none before the first read)."""
        return self._class_configs[1] if self._class_configs else ()

    async def refresh_class_configs(self) -> None:
        """Read the served DeviceClass's ``spec.config`` entries (every CLASS_CONFIG_TTL_S):
        kube-scheduler copies them into each allocation, so the controller does too."""
        now = time.monotonic()
        if self._class_configs is not None and now - self._class_configs[0] < CLASS_CONFIG_TTL_S:
            return
        obj = await self.writer.get_device_class(self.device_class)
        spec = obj.get("spec") if obj else None
        raw = spec.get("config") if isinstance(spec, Mapping) else None
        entries = [c for c in raw if isinstance(c, Mapping)] if isinstance(raw, list) else []
        self._class_configs = (now, entries)


__all__ = ["ClaimAllocator"]
