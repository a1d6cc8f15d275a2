"""Opportunistic placement: a batch pod beyond a GPU's guaranteed capacity, when it pays.

The sharing contract (docs/packing.md, "The sharing contract"): a pod's request is a guarantee,
and on a GPU the guaranteed shares add up to at most 100%. A batch pod that opted in
(``gpushare.io/opportunistic``, ``Demand.opportunistic``) and finds no GPU with its request
free may still run on a GPU (:meth:`Opportunism.gpu_option`) where

- the model, corrected by what GPUs measured of the same workloads (:class:`Corrections`),
  predicts the GPU does at least :data:`MIN_GAIN` more work per second with it (each batch
  tenant's rate over its rate alone on the whole GPU, summed: jobs' worth per second);
- every tenant there stays within its class bound (the admission rule,
  :func:`gpushare.packing.admission.admit_reason`, on corrected predictions). The newcomer
  itself is held to the gain, not to the batch bound: running now, however slowly, beats
  waiting with nothing done, and it is promoted or preempted later (docs/packing.md, "The
  sharing contract");
- its memory fits beside every tenant's, and the MPS server has a client left.

It holds no guaranteed share and runs as a batch client (MPS priority 1, its limit as thread
cap: MPS has two client priorities, and latency pods hold the higher one). It is promoted
(:meth:`Opportunism.promotions`) without a restart once its request fits among the guaranteed
shares and no pod that has waited longer for its guaranteed share needs that room. When a
guaranteed pod that did not opt in needs the room (:meth:`Opportunism.preemptions`), the
newest opportunistic tenants in its way are **paused** where their compute is what stands in
the way (a frozen MPS client gives its SMs back at once, keeps its GPU memory and loses no
work) and **evicted** only where the pod needs GPU memory or MPS clients that they hold, which
no pause frees. A latency pod also pauses those running with more threads than a batch pod
placed beside it gets (:func:`~gpushare.packing.threads.over_latency_cap`: MPS fixed their cap
when they started, and uncapped batch neighbours cost its tail, docs/packing.md). The governor
(:func:`gpushare.packing.governor.review`) pauses the newest one when the GPU measures less than
was predicted. A paused tenant runs again (:meth:`Opportunism.resumptions`) once it is
predicted to keep every guaranteed neighbour within its class bound and to add work, and, if it
was paused for measured harm, once the pods it was judged beside have left.

No preemption among equals: a pod that opted in (``Tenant.equal``) never pauses or evicts an
opportunistic tenant, and no tenant is paused for an opted-in neighbour's class bound.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpushare.api.names import CLASS_BATCH, CLASS_LATENCY, SLICES_PER_GPU
from gpushare.api.pause import REASON_GUARANTEED
from gpushare.packing.admission import (
    CONSERVATIVE_PROFILE,
    DEFAULT_BOUNDS,
    admit_reason,
    reserved,
)
from gpushare.packing.corrections import Corrections, cautious, corrected, members
from gpushare.packing.fit import Refusal, fit_reason, gpu_fit, host_reason
from gpushare.packing.interference import InterferenceModel, load_default, while_running
from gpushare.packing.model import (
    Assignment,
    Demand,
    GpuState,
    NodeState,
    Pause,
    PipeProfile,
    Tenant,
)
from gpushare.packing.opportunistic_memory import memory_for
from gpushare.packing.promotion import Waiting, promoted
from gpushare.packing.share_floor import floor_reason
from gpushare.packing.threads import assign_thread_percent, over_latency_cap, tenant_threads

MIN_GAIN = 0.05
"""Work per second (jobs' worth) a GPU must be predicted to gain with an opportunistic tenant.
The gain is a difference of a pack's predicted total work, which the model gets within 4.7% of
the measured on average over the 461 uncapped packs stored from the H100 and H200 runs (with
the floor of :data:`~gpushare.packing.interference.IDLE_FILLED`): a smaller gain is within
its error, and a pod placed for nothing holds its GPU memory and MPS client. Two saturating
training jobs gain 0.06 predicted, 0.08 measured: at 0.10 the heavy trace ran them one by one
(1.07x MPS without limits), at 0.05 together (1.005x; docs/benchmarks-gpu.md, "Runs 41 and 42")."""
KEEP_FRACTION = 0.5
"""The governor keeps an opportunistic tenant while the GPU's measured gain is at least this
share of the gain predicted when it was placed."""
OPPORTUNISTIC_COST = 1.0e6
"""Placement cost of an opportunistic option, less 100 x its predicted gain: any guaranteed
option (costs in GPU-percent, a few hundred at most) is preferred."""
PAUSE_COST = 10.0
"""Extra cost (GPU-percent) of each opportunistic tenant a guaranteed placement pauses: no
work is lost, but the tenant stops until room frees."""
EVICTION_COST = 50.0
"""Extra cost (GPU-percent) of each opportunistic tenant a guaranteed placement evicts: its
work so far is lost, so a GPU where pauses do is preferred."""
EVICT_MEMORY = "memory"
"""``Assignment.evict_reason``: the guaranteed pod needs GPU memory the evicted pods hold."""
EVICT_CLIENTS = "mps-clients"
"""``Assignment.evict_reason``: the guaranteed pod needs MPS client slots they hold (a frozen
client keeps its connection to the server)."""


# ---- what the guaranteed shares see -----------------------------------------------------------


def guaranteed_gpu(gpu: GpuState) -> GpuState:
    """``gpu`` with its guaranteed tenants only: what a guaranteed pod is placed against
    (opportunistic tenants make room when it needs them to). The same object when it has
    none."""
    if not gpu.has_opportunistic_tenant:
        return gpu
    return replace(gpu, tenants=[t for t in gpu.tenants if not t.opportunistic])


def guaranteed_node(node: NodeState) -> NodeState:
    """``node`` with :func:`guaranteed_gpu` of each GPU (the same object when nothing runs
    opportunistically there)."""
    if not any(g.has_opportunistic_tenant for g in node.gpus):
        return node
    return replace(node, gpus=[guaranteed_gpu(g) for g in node.gpus])


def reservation_reason(gpu: GpuState, demand: Demand, assignment: Assignment) -> str | None:
    """Why ``assignment`` cannot be held on ``gpu`` now, or None: an opportunistic one needs
    its memory and an MPS client beside every tenant (not a free guaranteed share); a
    guaranteed one fits once the tenants it evicts are gone (those it pauses keep their
    memory and clients)."""
    if assignment.opportunistic:
        probe = replace(demand, percent=1, memory_bytes=assignment.memory_limit_bytes)
        return fit_reason(gpu, probe)
    if assignment.evict:
        leaving = set(assignment.evict)
        gpu = replace(gpu, tenants=[t for t in gpu.tenants if t.key not in leaving])
    return fit_reason(gpu, demand)


@dataclass(frozen=True)
class Preemption:
    """What a guaranteed placement does to the opportunistic tenants of one GPU."""

    pause: tuple[str, ...] = ()
    """Tenants (pod keys) to pause: their compute stands in the way."""
    evict: tuple[str, ...] = ()
    """Tenants (pod keys) to evict: the newcomer needs memory or MPS clients they hold."""
    evict_reason: str = ""
    """:data:`EVICT_MEMORY` or :data:`EVICT_CLIENTS` when :attr:`evict` is not empty."""


NO_PREEMPTION = Preemption()


def _without(gpu: GpuState, leaving: Sequence[Tenant], pausing: Sequence[Tenant] = ()) -> GpuState:
    """``gpu`` with the ``leaving`` tenants gone and the ``pausing`` ones paused."""
    if not leaving and not pausing:
        return gpu
    gone = {t.key for t in leaving}
    paused = {t.key for t in pausing}
    return replace(
        gpu,
        tenants=[
            replace(t, pause=Pause(REASON_GUARANTEED)) if t.key in paused else t
            for t in gpu.tenants
            if t.key not in gone
        ],
    )


def _fewest(chosen: list[Tenant], enough: Callable[[list[Tenant]], bool]) -> list[Tenant]:
    """``chosen`` (newest first, ``enough`` of it) less every tenant, oldest first, that it is
    still enough without: a preemption goes no further than the newcomer needs."""
    out = list(chosen)
    for tenant in reversed(chosen):
        trial = [t for t in out if t is not tenant]
        if enough(trial):
            out = trial
    return out


@dataclass(frozen=True)
class Member:
    """A job on a GPU as the work-rate arithmetic sees it."""

    profile: PipeProfile
    threads: int
    gpu_class: str = CLASS_BATCH
    percent: int = SLICES_PER_GPU
    workload: str = ""


def member(tenant: Tenant) -> Member:
    return Member(
        tenant.profile or CONSERVATIVE_PROFILE,
        tenant_threads(tenant),
        tenant.gpu_class,
        tenant.percent,
        tenant.workload,
    )


def _opted_in(party: Tenant | Demand) -> bool:
    """One of the equals: a tenant that opted in (``Tenant.equal``), or an opted-in newcomer."""
    return party.equal if isinstance(party, Tenant) else party.opportunistic


def rates(members: Sequence[Member], model: InterferenceModel) -> list[float]:
    """Each member's predicted rate over its rate alone on the whole GPU (latency members
    included; they weigh on the others over their whole reserved share). Batch members alone
    are predicted as one pack (:meth:`InterferenceModel.predict_pack`: uncapped, they do at
    least one job's work together)."""
    if all(m.gpu_class != CLASS_LATENCY for m in members):
        pack = model.predict_pack([(m.profile, m.threads) for m in members])
        return [
            1.0 / (while_running(s, m.profile) * model.cap_slowdown(m.profile, m.threads))
            if m.profile.sm_utilization is not None
            else 1.0 / while_running(s, m.profile)
            for s, m in zip(pack, members, strict=True)
        ]
    loads = [
        (reserved(m.profile), m.percent) if m.gpu_class == CLASS_LATENCY else (m.profile, m.threads)
        for m in members
    ]
    out = []
    for i, m in enumerate(members):
        others = loads[:i] + loads[i + 1 :]
        slowdown = model.predict(m.profile, m.threads, others)
        if m.gpu_class != CLASS_LATENCY:
            slowdown = while_running(slowdown, m.profile)
            if m.profile.sm_utilization is not None:
                slowdown *= model.cap_slowdown(m.profile, m.threads)
        out.append(1.0 / slowdown)
    return out


def work_rate(members: Sequence[Member], model: InterferenceModel) -> float:
    """Batch work per second the members do together (jobs' worth): their :func:`rates`
    summed; a latency service does requests, not work, and is left out."""
    return _batch_sum(rates(members, model), members)


def _batch_sum(predicted: Sequence[float], members: Sequence[Member]) -> float:
    return sum(r for r, m in zip(predicted, members, strict=True) if m.gpu_class != CLASS_LATENCY)


# ---- the decisions --------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """Where an opportunistic pod may go on one GPU, and what it is predicted to bring."""

    gpu: GpuState
    threads: int
    memory_bytes: int
    gain: float
    before: float
    """The GPU's predicted work rate without the pod."""


@dataclass
class Opportunism:
    """The opportunistic rules (module doc) with the admission bounds and the corrections."""

    model: InterferenceModel = field(default_factory=load_default)
    bounds: Mapping[str, float] = field(default_factory=lambda: DEFAULT_BOUNDS)
    corrections: Corrections = field(default_factory=Corrections)
    min_gain: float = MIN_GAIN

    def _model(self, parties: Iterable[tuple[PipeProfile | None, str]]) -> InterferenceModel:
        return corrected(self.model, parties, self.corrections)

    def _guard(self, parties: Sequence[Tenant | Demand]) -> InterferenceModel:
        """The model that holds ``parties`` to their class bounds: corrected, but never less
        careful about a pod that did not opt in (:func:`corrections.cautious`)."""
        protected = [p.workload for p in parties if not _opted_in(p)]
        return corrected(self.model, members(parties), cautious(self.corrections, protected))

    def gpu_option(self, gpu: GpuState, demand: Demand) -> Option | str:
        """The opportunistic option for ``demand`` on ``gpu``, or why there is none."""
        if not demand.opportunistic or demand.gpu_class != CLASS_BATCH or demand.gpus != 1:
            return "not an opted-in batch pod of one GPU"
        if demand.profile is None:
            return "opportunistic placement needs the pod's measured profile (a GpuShare's)"
        if not gpu.tenants:
            return "GPU is idle"  # its request fits there: a guaranteed placement
        if any(t.percent >= SLICES_PER_GPU and not t.opportunistic for t in gpu.tenants):
            return "GPU is held whole (its tenant runs without MPS)"
        memory = memory_for(demand, gpu)
        if memory is None:
            return "no GPU memory free beside its tenants' caps"
        # Every fit check but the compute share, which is what it goes beyond.
        probe = replace(demand, percent=1, memory_bytes=memory)
        refusal = gpu_fit(gpu, probe)[0]
        if refusal is not None:
            return f"does not fit ({refusal.name.lower()})"
        running = gpu.running()  # a paused tenant's compute counts nowhere
        model = self._model(members([*running.tenants, demand]))
        guard = self._guard([*running.tenants, demand])
        # Its own thread cap (its limit, or the rule's: the whole GPU, half beside a latency
        # pod); a request of a whole GPU is read as one share short of it, so the cap applies.
        trial = replace(demand, percent=min(demand.percent, SLICES_PER_GPU - 1))
        threads = assign_thread_percent(trial, gpu)
        reason = admit_reason(gpu, trial, model=guard, bounds=self.bounds, newcomer_bound=False)
        if reason is not None:
            return reason
        newcomer = Member(demand.profile, threads, CLASS_BATCH, demand.percent, demand.workload)
        reason, before, gain = self._beside(running.tenants, newcomer, model)
        if reason is not None:
            return reason
        if gain < self.min_gain:
            return f"predicted gain {gain:.2f} jobs/s, below {self.min_gain:.2f}"
        return Option(gpu, threads, memory, gain, before)

    def node_option(self, node: NodeState, demand: Demand) -> Option | str:
        """The GPU of ``node`` where ``demand`` gains most opportunistically, or why none."""
        host = host_reason(node, demand)
        if host is not None:
            return host
        best: Option | None = None
        first = ""
        for gpu in node.gpus:
            option = self.gpu_option(gpu, demand)
            if isinstance(option, str):
                first = first or option
            elif best is None or option.gain > best.gain:
                best = option
        return best if best is not None else first or "node has no GPUs"

    def preemptions(
        self, gpu: GpuState, demand: Demand, *, admit: bool = True
    ) -> Preemption | None:
        """What ``demand``, placed by its guaranteed share, does to ``gpu``'s opportunistic
        tenants to fit: the newest ones whose memory or MPS clients it needs are evicted (a
        pause frees neither), then, with ``admit``, the newest running ones are paused until
        the newcomer and every tenant that did not opt in are predicted within their class
        bounds and, for a latency pod, none runs over the thread cap a batch pod beside it
        gets; no further than needed either way. None when it does not fit even so (it is
        then not placed on ``gpu``). A pod that opted in preempts nobody (no preemption among
        equals): it fits beside everyone or not at all."""
        if demand.opportunistic:
            fits = gpu_fit(gpu, demand)[0] is None and (
                not admit or demand.whole or self._admits(gpu, demand)
            )
            return NO_PREEMPTION if fits else None
        newest = sorted((t for t in gpu.tenants if t.opportunistic), key=lambda t: -t.placed_at)
        refusal = gpu_fit(gpu, demand)[0]
        evict: list[Tenant] = []
        reason = ""
        while refusal in (Refusal.MEMORY, Refusal.CLIENTS):
            if len(evict) == len(newest):
                return None
            reason = reason or (EVICT_MEMORY if refusal is Refusal.MEMORY else EVICT_CLIENTS)
            evict.append(newest[len(evict)])
            refusal = gpu_fit(_without(gpu, evict), demand)[0]
        if refusal is not None:
            return None
        evict = _fewest(evict, lambda kept: gpu_fit(_without(gpu, kept), demand)[0] is None)
        staying = _without(gpu, evict)
        if not admit or demand.whole:
            return Preemption((), tuple(t.key for t in evict), reason if evict else "")
        running = [t for t in newest if t not in evict and t.pause is None]
        pause: list[Tenant] = []

        def admitted(pausing: list[Tenant]) -> bool:
            trial = _without(staying, (), pausing)
            opportunistic = [t for t in trial.running().tenants if t.opportunistic]
            if demand.gpu_class == CLASS_LATENCY and any(map(over_latency_cap, opportunistic)):
                return False  # it keeps its threads: beside a latency pod it pauses
            return not opportunistic or self._admits(trial, demand)

        while not admitted(pause):
            if len(pause) == len(running):
                return None
            pause.append(running[len(pause)])
        pause = _fewest(pause, admitted)
        return Preemption(
            tuple(t.key for t in pause), tuple(t.key for t in evict), reason if evict else ""
        )

    def _admits(self, gpu: GpuState, demand: Demand) -> bool:
        """``demand`` joins ``gpu`` with it and every tenant that did not opt in predicted
        within their class bounds (paused tenants count for nothing)."""
        running = gpu.running()
        return (
            admit_reason(
                running,
                demand,
                model=self._guard([*running.tenants, demand]),
                bounds=self.bounds,
                equals_bound=False,
            )
            is None
        )

    def promotions(self, gpu: GpuState, waiting: Sequence[Waiting] = ()) -> list[str]:
        """Running opportunistic tenants of ``gpu`` whose request now fits among the
        guaranteed shares, oldest first, leaving their share to the pods ``waiting`` since
        before them that would go there without an eviction (:func:`promotion.promoted`). A
        paused one is resumed first (:meth:`resumptions`)."""
        return promoted(gpu, waiting, lambda demand: self._placeable(gpu, demand))

    def _placeable(self, gpu: GpuState, demand: Demand) -> bool:
        """``demand`` goes on ``gpu`` now by its guaranteed share, pausing tenants if need
        be, evicting none."""
        preemption = self.preemptions(gpu, demand)
        return preemption is not None and not preemption.evict

    def resumptions(self, gpu: GpuState) -> list[str]:
        """Paused opportunistic tenants of ``gpu`` to run again now, oldest first, each counted
        as running before the next is tried: one whose pause was for measured harm once none
        of the pods it was judged beside is on the GPU any more; then any whose running is
        predicted to keep every tenant that did not opt in within its class bound and to add
        work, and that is not over the thread cap beside a latency pod there
        (:meth:`resume_reason`). Only opportunistic tenants are ever paused by gpushare; a
        pause on a pod holding a guaranteed share was written by someone else (an admin) and
        is theirs to lift."""
        paused = sorted(
            (t for t in gpu.tenants if t.pause is not None and t.opportunistic),
            key=lambda t: t.placed_at,
        )
        if not paused:
            return []
        present = {t.key for t in gpu.tenants}
        out: list[str] = []
        trial = gpu
        for tenant in paused:
            if self.resume_reason(trial, tenant, present) is not None:
                continue
            out.append(tenant.key)
            trial = replace(
                trial,
                tenants=[
                    replace(t, pause=None) if t.key == tenant.key else t for t in trial.tenants
                ],
            )
        return out

    def resume_reason(
        self, gpu: GpuState, tenant: Tenant, present: frozenset[str] | set[str] | None = None
    ) -> str | None:
        """Why paused ``tenant`` of ``gpu`` stays paused, or None (:meth:`resumptions`).
        ``present``: the pods on the GPU (its tenants' keys when None)."""
        pause = tenant.pause
        if pause is None:
            return None
        on_gpu = present if present is not None else {t.key for t in gpu.tenants}
        if pause.for_harm:
            still = sorted(pause.beside & on_gpu)
            if still:
                return f"paused for measured harm beside {', '.join(still)}, still there"
        running = gpu.running()
        if running.has_latency_tenant and over_latency_cap(tenant):
            return f"its {tenant_threads(tenant)}% threads are over the cap beside a latency pod"
        trial = Demand(
            percent=min(tenant.percent, SLICES_PER_GPU - 1),
            limit_percent=tenant_threads(tenant),
            memory_bytes=tenant.memory_bytes,
            profile=tenant.profile,
            tenancy=tenant.tenancy,
            opportunistic=True,
            workload=tenant.workload,
        )
        model = self._model(members([*running.tenants, trial]))
        reason = admit_reason(
            running,
            trial,
            model=self._guard([*running.tenants, trial]),
            bounds=self.bounds,
            newcomer_bound=False,
            equals_bound=False,
        )
        if reason is not None:
            return reason
        reason, before, gain = self._beside(running.tenants, member(tenant), model)
        if reason is not None:
            return reason
        if gain <= 0.0:
            after = before + gain
            return f"predicted to add no work ({after:.2f} jobs/s with it, {before:.2f} without)"
        return None

    def _beside(
        self, tenants: Sequence[Tenant], newcomer: Member, model: InterferenceModel
    ) -> tuple[str | None, float, float]:
        """Running ``newcomer`` beside ``tenants``: why it would take a guaranteed tenant
        below its share's floor (:func:`share_floor.floor_reason`) or None, the GPU's predicted
        work rate without it, and the work it adds."""
        present = [member(t) for t in tenants]
        before = rates(present, model)
        after = rates([*present, newcomer], model)
        was = _batch_sum(before, present)
        gain = _batch_sum(after, [*present, newcomer]) - was
        return floor_reason(tenants, before, after[:-1], model), was, gain
