"""Bind: take the GPUs filter held (or choose them now) and POST the Binding with the placement.

Binds of pods of one size to one node are serialized, each waiting until no other pod of that
size on the node still waits for its Allocate: the kubelet calls Allocate with device IDs only,
and the node agent tells waiting pods apart by GPU and slice count (docs/scheduling.md, "Bind
protocol"). Only gpushare-scheduler's pods are bound, and only to a node filter offered.
"""

import asyncio
import logging
from datetime import UTC, datetime

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import (
    SCHEDULER_NAME,
    SLICES_PER_GPU,
    STATE_ASSUMED,
    TIER_GUARANTEED,
    TIER_OPPORTUNISTIC,
)
from gpushare.api.placement import Placement
from gpushare.cluster.extender.answers import scheduler_safe
from gpushare.cluster.extender.args import BindingArgs
from gpushare.cluster.extender.base import ExtenderBase
from gpushare.cluster.state import pod_facts, pods
from gpushare.cluster.state.reservations import Reservation, ReservationError
from gpushare.cluster.state.share_rules import (
    NO_RULES,
    ShareRules,
    with_profile,
)
from gpushare.packing.model import Assignment, Demand

log = logging.getLogger(__name__)

OPPORTUNISTIC_SIZE = 1_000_000
"""Offset of the bind gate's size key for pods asking for the opportunistic resource."""


class BindVerbs(ExtenderBase):
    """bind."""

    async def bind(self, args: BindingArgs) -> dict[str, str]:
        """Choose GPU(s), hold them in the view before any await, then POST the Binding with
        the placement annotations in it (the API server sets them with ``spec.nodeName`` in one
        update). On failure the hold is rolled back; nothing was written.

        Binds of pods of one size to one node are serialized, and each waits until no other pod
        of that size on the node is still waiting for its Allocate: the kubelet calls Allocate
        with device IDs only, and the node agent tells waiting pods apart by GPU and slice
        count, so only same-size pods could be mistaken for each other.
        """
        if self.writer is None:
            return {"Error": "gpushare: this extender has no API access and cannot bind"}
        key = f"{args.pod_namespace}/{args.pod_name}"
        held = self.view.reservation(key)
        if held is not None and not held.assignment.gpu_uuids and self.view.pod(key) is None:
            return await self._bind_without_gpus(args, held)
        size = self._size(key)
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self.gate_seconds
        lock = self._node_locks.setdefault((args.node, size), asyncio.Lock())
        try:
            async with asyncio.timeout_at(deadline):
                await lock.acquire()
        except TimeoutError:
            self._observe("gate", loop.time() - start)
            waiting = self._ambiguous(args.node, key, size)
            return {
                "Error": f"gpushare: node {args.node} is busy: {len(waiting)} pod(s) there "
                "still wait for their GPU allocation; the pod will be retried"
            }
        try:
            refused = await self._gate(args.node, key, size, deadline)
            opened = loop.time()
            self._observe("gate", opened - start)
            if refused is not None:
                return refused
            result = await self._bind(args)
            self._observe("write", loop.time() - opened)
        finally:
            lock.release()
        return {"Error": scheduler_safe(result["Error"])}

    async def _gate(self, node: str, key: str, size: int, deadline: float) -> dict[str, str] | None:
        """Wait until no pod on ``node`` the node agent could mistake for this one waits for
        its Allocate; the error to answer with when none got its allocation for the whole wait
        (the node agent or kubelet is not answering, and a pod bound now would be refused by
        the kubelet, "no healthy devices", and end Failed: let the scheduler retry)."""
        seen = self.view.allocations_seen(node)
        waiting = await self._wait_for_allocations(node, key, size, deadline)
        if waiting and self.view.allocations_seen(node) == seen:
            log.warning(
                "not binding: no pod on the node got its allocation during the wait",
                extra={"pod": key, "node": node, "waiting": waiting[:5]},
            )
            return {
                "Error": scheduler_safe(
                    f"gpushare: node {node}: {len(waiting)} pod(s) there have waited "
                    f"{self.gate_seconds:.0f}s for their GPU allocation and none got it "
                    "(is the gpushare node agent running there?); the pod will be retried"
                )
            }
        if waiting:
            log.warning(
                "binding while other pods still wait for their allocation",
                extra={"pod": key, "node": node, "waiting": waiting[:5]},
            )
        return None

    def _observe(self, stage: str, seconds: float) -> None:
        if self.bind_stage_observer is not None:
            self.bind_stage_observer(stage, seconds)

    def _wake(self, node: str) -> None:
        event = self._node_events.get(node)
        if event is not None:
            event.set()

    def _size(self, key: str) -> int:
        """The slices the kubelet will ask the node agent for, as the view knows them (-1 when
        unknown: such a pod waits for every other pod on the node): the gpu-percent request,
        offset by :data:`OPPORTUNISTIC_SIZE` for a pod asking for the opportunistic resource
        (another device plugin: never mistaken for a pod asking gpu-percent)."""
        known = self.view.pod(key)
        if known is None or known.demand is None:
            return -1
        demand = known.demand
        return demand.percent + (OPPORTUNISTIC_SIZE if demand.opportunistic else 0)

    def _ambiguous(self, node: str, key: str, size: int) -> list[str]:
        """Pods on ``node`` still waiting for their Allocate that the node agent could mistake
        for this one. It tells waiting pods apart by GPU and slice count
        (deviceplugin.matching.select_pod), so only pods of the same size, or of unknown
        size, count."""
        out: list[str] = []
        for other in self.view.awaiting_allocation(node, exclude=key):
            other_size = self._size(other)
            if size >= 0 and other_size >= 0 and other_size != size:
                continue
            out.append(other)
        return out

    async def _wait_for_allocations(
        self, node: str, key: str, size: int, deadline: float
    ) -> list[str]:
        """Wait (woken by the view, no polling) until no pod on ``node`` that the node agent
        could mistake for this one waits for its Allocate, or until ``deadline``; returns those
        still waiting."""
        loop = asyncio.get_running_loop()
        event = self._node_events.setdefault(node, asyncio.Event())
        while True:
            event.clear()
            waiting = self._ambiguous(node, key, size)
            remaining = deadline - loop.time()
            if not waiting or remaining <= 0:
                return waiting
            try:
                async with asyncio.timeout(remaining):
                    await event.wait()
            except TimeoutError:
                return self._ambiguous(node, key, size)

    async def _pod_facts(
        self, args: BindingArgs
    ) -> tuple[str, str | None, Demand | None, ShareRules, str]:
        """(uid, node it is bound to, demand, GpuShare rules, scheduler name) from the view, or
        from a GET when the view does not know this pod (or an older pod of the same name).
        Raises InvalidInputError for unreadable annotations and KubeError-like exceptions for
        API failures."""
        assert self.writer is not None
        key = f"{args.pod_namespace}/{args.pod_name}"
        known = self.view.pod(key)
        if (
            known is not None
            and (not args.pod_uid or known.uid == args.pod_uid)
            and (known.demand is not None or known.problem is not None)
        ):
            if known.demand is None and known.problem is not None:
                raise InvalidInputError(key, known.problem, "fix the pod's gpushare annotations")
            rules = self.view.pod_rules().get(key, NO_RULES)
            return known.uid, known.node, known.demand, rules, known.scheduler
        pod = await self.writer.get_pod(namespace=args.pod_namespace, name=args.pod_name)
        demand, rules = self._read(pod)
        demand = with_profile(demand, rules) if demand is not None else None
        return pods.pod_uid(pod), pods.node_name(pod), demand, rules, pods.scheduler_name(pod)

    async def _bind(self, args: BindingArgs) -> dict[str, str]:
        """Bind one pod whose turn it is (:meth:`bind` holds its gate): read it, check the
        bind is ours to do, choose its GPUs and write the Binding; ``{"Error": ""}`` when
        bound."""
        assert self.writer is not None
        ns, name, node_name = args.pod_namespace, args.pod_name, args.node
        key = f"{ns}/{name}"
        try:
            uid, bound_to, demand, rules, scheduler = await self._pod_facts(args)
        except Exception as exc:  # InvalidInputError (its annotations) or the API's failure
            return {"Error": f"gpushare: {exc}"}
        if args.pod_uid and uid != args.pod_uid:
            return {"Error": f"gpushare: pod {key} was recreated (uid {uid}, asked {args.pod_uid})"}
        if bound_to is not None:
            if bound_to == node_name:
                return {"Error": ""}  # a retried bind that already went through
            return {"Error": f"gpushare: pod {key} is already bound to {bound_to}"}
        refusal = self._not_ours(key, uid, node_name, scheduler=scheduler)
        if refusal is not None:
            log.warning("bind refused", extra={"pod": key, "node": node_name, "why": refusal})
            return {"Error": f"gpushare: {refusal}"}
        if demand is None:
            return await self._plain_bind(ns, name, uid, node_name)
        absent = await self._agent_absent(node_name)
        if absent is not None:
            log.warning("not binding: node agent not ready", extra={"pod": key, "why": absent})
            return {"Error": f"gpushare: {absent}; the pod will be retried"}
        # From here to view.reserve() nothing awaits: no other bind can interleave.
        demand = self._within_quota(key, demand)
        assignment = self._assignment(key, uid, node_name, demand, rules)
        if isinstance(assignment, str):
            return {"Error": assignment}
        bind_time = datetime.now(UTC)
        try:
            held = self.view.reserve(
                key=key,
                uid=uid,
                node=node_name,
                assignment=assignment,
                demand=demand,
                bind_time=bind_time,
            )
        except ReservationError as exc:
            return {"Error": f"gpushare: {exc}"}
        assignment = held.assignment  # opportunistic when its quota did not count it (#67)
        placement = _placement(assignment, demand, bind_time)
        if assignment.pause and self.pauser is not None:
            # Paused before the Binding: the kubelet cannot start the pod before it is bound,
            # and the node agent freezes on the request's watch event (docs/scheduling.md).
            refused = await self.pauser(key, assignment)
            if refused is not None:
                self.view.release(held)
                return {"Error": f"gpushare: {refused}; the pod will be retried"}
        return await self._write_binding(args, uid, held, placement, assignment)

    async def _agent_absent(self, node: str) -> str | None:
        """Why ``node``'s agent cannot take a pod now (``agent_check``), asked only where an
        agent keeps a Lease (a node of an older agent, or none, is judged as before)."""
        if self.agent_check is None or not self.view.agents.leased(node):
            return None
        info = self.view.node_info(node)
        return await self.agent_check.not_ready(node, info.address if info else None)

    def _assignment(
        self, key: str, uid: str, node_name: str, demand: Demand, rules: ShareRules
    ) -> Assignment | str:
        """The GPU(s) for the pod on ``node_name``: what filter held for it when that still
        holds, else the placer's choice; or the error to answer with. Never awaits."""
        waits = self._hold_reason(rules)
        if waits is not None:
            return f"gpushare: {waits}"
        node, refusal = self._node(node_name, key, rules)
        if node is None or (not node.gpus and refusal is None):
            return f"gpushare: node {node_name} has no GPUs shared by gpushare"
        hold = self.view.reservation(key)
        usable = {g.uuid for g in node.gpus}
        if (
            hold is not None
            and hold.is_hold
            and hold.node == node_name
            and hold.uid == uid
            and usable.issuperset(hold.assignment.gpu_uuids)
        ):
            return hold.assignment  # what filter promised
        assignment = self.placer.choose_gpus(node, demand) if node.gpus else None
        if assignment is None:
            reason = (self.placer.refusal(node, demand) if node.gpus else None) or refusal
            return scheduler_safe(f"gpushare: node {node_name}: {reason or 'no GPU fits'}")
        return assignment

    async def _write_binding(
        self,
        args: BindingArgs,
        uid: str,
        held: Reservation,
        placement: Placement,
        assignment: Assignment,
    ) -> dict[str, str]:
        """POST the Binding with the placement annotations; on failure release the share held
        for it (unless the pod is bound anyway: a lost response). Tells the bound listeners."""
        assert self.writer is not None
        ns, name, node_name = args.pod_namespace, args.pod_name, args.node
        key = f"{ns}/{name}"
        try:
            await self.writer.bind_pod(
                namespace=ns,
                name=name,
                uid=uid,
                node=node_name,
                annotations=placement.to_annotations(),
            )
        except Exception as exc:
            current = await self._current_binding(ns, name)
            if current is not None and current[0] == node_name:
                # Bound anyway (a lost response, or a retried bind that won the race): the
                # annotations that came with that Binding are the record.
                if current[1] is None or current[1].gpu_uuids != assignment.gpu_uuids:
                    self.view.release(held)
                log.info("bind answered with an error but the pod is bound", extra={"pod": key})
                return {"Error": ""}
            self.view.release(held)
            log.warning(
                "bind failed; share released",
                extra={"pod": key, "node": node_name, "error": str(exc)},
            )
            return {"Error": f"gpushare: {exc}"}
        log.info(
            "bound",
            extra={
                "pod": key,
                "node": node_name,
                "gpus": list(assignment.gpu_uuids),
                "thread_percent": assignment.thread_percent,
                "request_percent": placement.request_percent,
                "memory_limit": assignment.memory_limit_bytes,
                "tier": placement.tier,
                "pauses": list(assignment.pause),
                "evicts": list(assignment.evict),
            },
        )
        for listener in self.bound_listeners:
            try:
                listener(key, assignment)
            except Exception:
                log.exception("bound listener failed", extra={"pod": key})
        return {"Error": ""}

    def _not_ours(self, key: str, uid: str, node: str, *, scheduler: str) -> str | None:
        """Why this bind is not the caller's to ask for, or None: the extender binds only
        pods of gpushare-scheduler (with the controller's cluster-wide binding right, anything
        else would let a caller move any pod), with or without a GPU share, and only to a node
        its own filter offered for that pod moments before."""
        if scheduler != SCHEDULER_NAME:
            return (
                f"pod {key} is scheduled by {scheduler or 'default-scheduler'!r}, not "
                f"{SCHEDULER_NAME}; this extender binds only the pods {SCHEDULER_NAME} places"
            )
        if not self.offers.offered(key, uid, node):
            return (
                f"node {node} was not offered for pod {key} by this controller's filter (or the "
                "offer expired); the scheduler filters again"
            )
        return None

    async def _bind_without_gpus(self, args: BindingArgs, held: Reservation) -> dict[str, str]:
        """Bind a pod without GPUs whose CPU and memory filter held: nothing waits for an
        Allocate, so no gate; the hold ends with the bind (the watch then counts the pod)."""
        key = f"{args.pod_namespace}/{args.pod_name}"
        uid = args.pod_uid or held.uid
        if not self.offers.offered(key, uid, args.node):
            self.view.release(held)
            return {
                "Error": f"gpushare: node {args.node} was not offered for pod {key} by this "
                "controller's filter (or the offer expired); the scheduler filters again"
            }
        if held.node != args.node or (args.pod_uid and held.uid != args.pod_uid):
            self.view.release(held)
        result = await self._plain_bind(args.pod_namespace, args.pod_name, uid, args.node)
        if result["Error"]:
            self.view.release(held)
        return result

    async def _plain_bind(self, ns: str, name: str, uid: str, node: str) -> dict[str, str]:
        assert self.writer is not None
        try:
            await self.writer.bind_pod(namespace=ns, name=name, uid=uid, node=node)
        except Exception as exc:
            return {"Error": f"gpushare: {exc}"}
        return {"Error": ""}

    async def _current_binding(self, ns: str, name: str) -> tuple[str, Placement | None] | None:
        """(node, placement) of the pod as the API server has it now; None if unbound or
        unknown."""
        assert self.writer is not None
        try:
            pod = await self.writer.get_pod(namespace=ns, name=name)
        except Exception:
            return None
        # Read as the view reads every pod (its placement parsed there; None when malformed).
        facts = pod_facts.facts(pod)
        if facts.node is None:
            return None
        return facts.node, facts.placement


def _placement(assignment: Assignment, demand: Demand, bind_time: datetime) -> Placement:
    """The placement annotations a bind writes for ``assignment`` (state ``assumed``)."""
    return Placement(
        gpu_uuids=assignment.gpu_uuids,
        thread_percent=assignment.thread_percent,
        memory_limit_bytes=assignment.memory_limit_bytes,
        bind_time=bind_time,
        state=STATE_ASSUMED,
        request_percent=min(demand.percent, SLICES_PER_GPU),
        tier=TIER_OPPORTUNISTIC if assignment.opportunistic else TIER_GUARANTEED,
    )
