"""The data the policy works on: GPUs with their tenants, nodes, and what a pod demands."""

from dataclasses import dataclass, field

from gpushare.api.names import CLASS_BATCH, CLASS_LATENCY, MPS_MAX_CLIENTS, SLICES_PER_GPU
from gpushare.api.pause import REASON_HARM


@dataclass(frozen=True)
class PipeProfile:
    """Per-pipe utilization (0-1) of a job measured while it ran alone on a GPU: the policy's
    view of the one profile record, ``api.profile.GpuProfile``, not a second record. Its
    counters are those of ``api.profile.PLACEMENT_COUNTERS`` (and SM utilization) with "not
    measured" read as idle, and it is built from a record by one function,
    ``packing.stored_profile.pipe_profile``; it has no codec of its own.

    It stays a type of its own because the placement path (interference model, quick costs,
    fragmentation) does arithmetic on these few counters for every candidate GPU: plain floats
    there, where the record's ``None`` ("not measured") would need a check in each loop, and a
    small hashable value where the record carries the measurement's window, memory, time and
    source. Policy constants and simulations write one directly (``admission``'s conservative
    profile, the tests)."""

    fp16: float = 0.0
    fp32: float = 0.0
    fp64: float = 0.0
    tensor: float = 0.0
    sm_occupancy: float = 0.0
    dram_bandwidth: float = 0.0
    gpu_model: str = ""
    sm_utilization: float | None = None
    """Share of the SMs busy (GPM SM utilization, 0-1) while the job ran alone; None when not
    measured. Launch-bound jobs keep far more SMs busy than their occupancy suggests
    (docs/packing.md, "Where the constants come from"), and the interference model counts SM
    sharing with it; without it a job is assumed to fill its thread cap."""
    utilization: float | None = None
    """NVML utilization (0-1) while the job ran alone: the share of its time it had a kernel
    running, its kernel time; None when not measured. A job that sleeps between bursts (a
    notebook) is slowed by its neighbours only while its kernels run
    (``interference.while_running``)."""


@dataclass(frozen=True)
class Demand:
    """What a pod asks of one GPU (multi-GPU pods ask ``gpus`` whole GPUs instead)."""

    percent: int
    """Guaranteed compute share in GPU-percent (1..100); 100 with gpus > 1 for whole GPUs."""
    limit_percent: int | None = None
    """Most of the GPU its processes may use (``gpushare.io/gpu-limit``, GPU-percent, at least
    ``percent``); None = the default (:func:`gpushare.packing.threads.assign_thread_percent`)."""
    memory_bytes: int | None = None
    """Memory cap; None means proportional to percent of the chosen GPU's memory."""
    gpu_class: str = CLASS_BATCH
    gpus: int = 1
    """Whole GPUs wanted; > 1 only for multi-GPU pods (percent is then 100)."""
    processes: int = 1
    """MPS client processes the pod will run (budgeted against the server's client limit)."""
    profile: PipeProfile | None = None
    gpu_model: str | None = None
    """Restrict to GPUs of this model, when set; ``"A|B"`` allows either model."""
    cpu_milli: int = 0
    """Host CPU the pod requests (milli-CPU), checked against ``NodeState.cpu_milli_free``."""
    host_memory_bytes: int = 0
    """Host memory the pod requests, checked against ``NodeState.memory_free_bytes``."""
    avoid_gpus: frozenset[str] = frozenset()
    """GPU UUIDs the pod must not use (``gpushare.io/avoid-gpus``: a separated workload's GPU)."""
    tenancy: str | None = None
    """The tenancy the pod belongs to (its namespace, or the sharing group an admin put the
    namespace in): it shares a GPU only with tenants of the same tenancy. None: no boundary
    (cross-namespace sharing enabled, or a simulation)."""
    opportunistic: bool = False
    """The pod opted in to opportunistic placement (``gpushare.io/opportunistic``): where no
    GPU has its request free, it may run beyond the GPU's guaranteed capacity when that is
    predicted to pay (:mod:`gpushare.packing.opportunistic`; docs/packing.md, "The sharing
    contract")."""
    workload: str = ""
    """What the pod's measured interference corrections are kept by (its GpuShare, or a
    benchmark's job kind); empty when nothing identifies it."""
    peak_memory_bytes: int | None = None
    """Peak GPU memory its profile measured (a GpuShare's ``status.profile.memoryBytes``): an
    opportunistic pod's memory cap may come down to it, with headroom, never below
    (:func:`gpushare.packing.opportunistic_memory.memory_steps`)."""
    guarantee: bool = True
    """It may hold a guaranteed share. False for an opted-in pod its namespace's quota did not
    count (gpushare.cluster.state.quotas): it is placed only as an opportunistic tenant."""

    @property
    def whole(self) -> bool:
        return self.percent >= SLICES_PER_GPU

    def __hash__(self) -> int:
        # Demands key the placer's and the extender's answer caches, once per candidate node:
        # hash the 13 fields once (the instance is frozen).
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(tuple(self.__dict__[f] for f in _DEMAND_FIELDS))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict[str, object]:
        # str hashes differ between processes: a pickled copy hashes itself afresh.
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


_DEMAND_FIELDS = tuple(Demand.__dataclass_fields__)


@dataclass(frozen=True)
class Pause:
    """Why and since when an opportunistic tenant is paused (the pod's ``gpushare.io/pause``,
    ``api.pause.PauseRequest``): its processes are frozen, so it keeps its GPU memory and MPS
    client but uses no compute (docs/packing.md, "The sharing contract")."""

    reason: str
    """``api.pause.REASON_GUARANTEED`` (a guaranteed pod needed the compute) or
    ``REASON_HARM`` (the governor measured it harming a neighbour that did not opt in)."""
    since: float = 0.0
    """When it was asked (seconds since the epoch; 0 unknown)."""
    beside: frozenset[str] = frozenset()
    """The pods (keys) it was paused for: the guaranteed pod that needed the room, or the
    neighbours the governor judged it by; a pod paused for harm runs again only once they
    have left its GPU."""

    @property
    def for_harm(self) -> bool:
        return self.reason == REASON_HARM


@dataclass(frozen=True)
class Tenant:
    """A pod already placed on a GPU."""

    key: str
    """namespace/name of the pod."""
    percent: int
    memory_bytes: int
    gpu_class: str = CLASS_BATCH
    processes: int = 1
    profile: PipeProfile | None = None
    thread_percent: int | None = None
    """MPS active-thread % the pod runs with; None means equal to ``percent``."""
    tenancy: str | None = None
    """The tenancy (namespace or sharing group) of the pod; None when unknown."""
    opportunistic: bool = False
    """Runs beyond the GPU's guaranteed capacity: its percent is not counted in the GPU's
    guaranteed shares (its memory and MPS clients are), and it is preempted when a guaranteed
    pod needs the room (docs/packing.md, "The sharing contract")."""
    workload: str = ""
    """See :attr:`Demand.workload`."""
    placed_at: float = 0.0
    """When it was placed (seconds since the epoch; 0 unknown): the newest opportunistic
    tenant is preempted first, the oldest promoted first."""
    opted_in: bool = False
    """The pod opted in to opportunistic placement (``Demand.opportunistic``), whatever its
    tier now: no preemption among equals, so an opted-in pod never pauses or evicts another
    opted-in pod, nor is one paused on its behalf (an opportunistic tenant is always opted
    in: :attr:`equal`)."""
    pause: Pause | None = None
    """Set while the tenant is paused (only an opportunistic tenant is): its memory and MPS
    client count, its compute counts nowhere (:meth:`GpuState.running`)."""

    @property
    def paused(self) -> bool:
        return self.pause is not None

    @property
    def equal(self) -> bool:
        """Opted in (opportunistic, or holding a share it opted in for): one of the equals no
        other opted-in pod may preempt, and whose class bound does not make one pause."""
        return self.opted_in or self.opportunistic


@dataclass
class GpuState:
    """One GPU and the guaranteed shares placed on it."""

    uuid: str
    memory_bytes: int
    model: str = ""
    index: int = 0
    healthy: bool = True
    tenants: list[Tenant] = field(default_factory=list)
    max_clients: int = MPS_MAX_CLIENTS

    def __post_init__(self) -> None:
        self._totals_of: list[Tenant] | None = None
        self._totals_len = 0
        self._totals = (0, 0, 0, 0)
        self._measured = (0, 0)
        self._signature: tuple[object, ...] | None = None
        self._paused = 0
        self._running: GpuState | None = None

    def totals(self) -> tuple[int, int, int, int]:
        """(allocated percent, memory, MPS client processes, latency-class tenants) over the
        tenants; the allocated percent is the guaranteed shares' (opportunistic tenants hold
        none), memory and clients count every tenant. Placement reads these for every GPU of
        every candidate node, so they are kept until ``tenants`` is replaced by another list or
        grows (the controller's view replaces the list on every change, the simulator
        appends): never edit a tenant list in place otherwise."""
        if self._totals_of is not self.tenants or self._totals_len != len(self.tenants):
            self._recount()
        return self._totals

    def measured_tenants(self) -> tuple[int, int]:
        """(tenants with a measured profile, of which latency-class): whether interference
        admission and cost have anything to predict here (kept like :meth:`totals`)."""
        if self._totals_of is not self.tenants or self._totals_len != len(self.tenants):
            self._recount()
        return self._measured

    def signature(self) -> tuple[object, ...] | None:
        """Everything placement reads of this GPU for a pod without a profile, or None when a
        tenant has a measured profile or runs opportunistically (interference and preemption
        then make the tenants themselves matter):
        GPUs with equal signatures are interchangeable for such pods (the placer's memo,
        :func:`gpushare.packing.placer.node_signature`). Kept like :meth:`totals`; the GPU's
        own fields (health, model, memory, client limit) are fixed once it is made."""
        if self._totals_of is not self.tenants or self._totals_len != len(self.tenants):
            self._recount()
        return self._signature

    def running(self) -> "GpuState":
        """This GPU as its compute sees it: without its paused tenants (their memory and MPS
        clients still count, in :meth:`totals`; their load counts in no prediction). The same
        object when none is paused; kept like :meth:`totals`."""
        if self._totals_of is not self.tenants or self._totals_len != len(self.tenants):
            self._recount()
        if not self._paused:
            return self
        if self._running is None:
            self._running = GpuState(
                uuid=self.uuid,
                memory_bytes=self.memory_bytes,
                model=self.model,
                index=self.index,
                healthy=self.healthy,
                tenants=[t for t in self.tenants if t.pause is None],
                max_clients=self.max_clients,
            )
        return self._running

    @property
    def paused_tenants(self) -> int:
        """How many tenants are paused (kept like :meth:`totals`)."""
        if self._totals_of is not self.tenants or self._totals_len != len(self.tenants):
            self._recount()
        return self._paused

    def _recount(self) -> None:
        tenants = self.tenants
        used = memory = clients = latency = profiled = profiled_latency = paused = 0
        tenancies: set[str | None] = set()
        opportunistic = False
        for t in tenants:
            if t.opportunistic:
                opportunistic = True
            else:
                used += t.percent
            if t.pause is not None:
                paused += 1
            memory += t.memory_bytes
            clients += t.processes
            is_latency = t.gpu_class == CLASS_LATENCY
            if is_latency:
                latency += 1
            if t.profile is not None:
                profiled += 1
                if is_latency:
                    profiled_latency += 1
            tenancies.add(t.tenancy)
        self._totals = (used, memory, clients, latency)
        self._measured = (profiled, profiled_latency)
        self._paused, self._running = paused, None
        self._signature = (
            None
            if profiled
            or opportunistic
            or paused  # who may be preempted matters: no shared answers
            else (
                used,
                self.healthy,
                self.model,
                self.memory_bytes,
                memory,
                self.max_clients,
                clients,
                latency,
                tuple(sorted((t is None, t or "") for t in tenancies)),
            )
        )
        self._totals_of, self._totals_len = tenants, len(tenants)

    @property
    def used_percent(self) -> int:
        return self.totals()[0]

    @property
    def free_percent(self) -> int:
        return SLICES_PER_GPU - self.used_percent

    @property
    def used_memory(self) -> int:
        return self.totals()[1]

    @property
    def free_memory(self) -> int:
        return self.memory_bytes - self.used_memory

    @property
    def clients(self) -> int:
        return self.totals()[2]

    @property
    def has_opportunistic_tenant(self) -> bool:
        return any(t.opportunistic for t in self.tenants)

    @property
    def has_latency_tenant(self) -> bool:
        return any(t.gpu_class == CLASS_LATENCY for t in self.tenants)

    @property
    def idle(self) -> bool:
        return not self.tenants


@dataclass
class NodeState:
    """A node's GPUs plus the non-GPU resources the simulator also tracks."""

    name: str
    gpus: list[GpuState]
    cpu_milli_free: int | None = None
    memory_free_bytes: int | None = None

    def gpu(self, uuid: str) -> GpuState | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)


@dataclass(frozen=True)
class Assignment:
    """The policy's decision for one pod on one node."""

    node: str
    gpu_uuids: tuple[str, ...]
    thread_percent: int
    """MPS active-thread percentage the pod's processes get."""
    memory_limit_bytes: int
    """MPS pinned device memory limit per GPU."""
    opportunistic: bool = False
    """Placed beyond the GPU's guaranteed capacity (the pod holds no guaranteed share there
    until it is promoted; docs/packing.md, "The sharing contract")."""
    pause: tuple[str, ...] = ()
    """Opportunistic tenants (pod keys) to pause for this guaranteed placement: their compute
    would put a guaranteed pod past its class bound. They keep their GPU memory and MPS
    client, lose no work, and run again when room frees (``Opportunism.resumptions``)."""
    evict: tuple[str, ...] = ()
    """Opportunistic tenants (pod keys) to evict for this guaranteed placement: it needs GPU
    memory (or MPS clients) they hold, which no pause frees. Their work is lost."""
    evict_reason: str = ""
    """Why :attr:`evict` is not empty: ``opportunistic.EVICT_MEMORY`` or
    ``EVICT_CLIENTS``."""
    predicted_gain: float = 0.0
    """For an opportunistic placement: work per second the GPU is predicted to gain with the
    pod (jobs' worth), what the governor later holds the measurement to."""

    @property
    def displaces(self) -> tuple[str, ...]:
        """Every tenant this placement pauses or evicts."""
        return self.pause + self.evict
