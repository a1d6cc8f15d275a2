"""Sharing schemes as pure decisions: given the queue and what runs, which jobs start now, with
which MPS settings. The runner executes the decisions on the real GPU."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from bench.gpu.traces import TraceJob
from gpushare.api.pause import REASON_GUARANTEED
from gpushare.api.profile import GpuProfile
from gpushare.packing.model import Pause


@dataclass(frozen=True)
class Launch:
    job: TraceJob
    thread_percent: int | None = None
    """MPS active-thread %, None = no cap (or no MPS)."""
    priority: int | None = None
    """MPS client priority, None = driver default."""
    memory_limit_mib: int | None = None
    """MPS pinned device memory limit, None = none."""
    note: str = ""
    env: Mapping[str, str] | None = None
    """The client's ``CUDA_MPS_*`` limits as gpushare's device plugin writes them (the gpushare
    scheme); None: built from the fields above (the baselines)."""
    mps: bool | None = None
    """False: this job runs without MPS even under an MPS scheme (a whole GPU under gpushare);
    None: as its scheme says."""
    opportunistic: bool = False
    """gpushare placed it beyond the GPU's guaranteed capacity (preemptible until promoted)."""
    opted_in: bool = False
    """The pod opted in (``gpushare.io/opportunistic``), wherever it was placed: one of the
    equals, not held to its class bound beside other opted-in pods (``Tenant.equal``)."""
    pause: tuple[str, ...] = ()
    """Jobs (ids) gpushare pauses to start this one: opportunistic ones whose compute is in its
    way (frozen, they keep their GPU memory and lose no work: ``Assignment.pause``)."""
    evict: tuple[str, ...] = ()
    """Jobs (ids) gpushare evicts to start this one: it needs GPU memory they hold, which no
    pause frees (``Assignment.evict``); they start again from scratch."""
    gain: float = 0.0
    """For an opportunistic launch: the work per second the GPU was predicted to gain."""

    def settings(self) -> tuple[object, ...]:
        env = tuple(sorted(self.env.items())) if self.env is not None else None
        return (self.thread_percent, self.priority, self.memory_limit_mib, env, self.mps)

    def same_settings(self, other: "Launch") -> bool:
        return self.settings() == other.settings()


@dataclass
class Running:
    job: TraceJob
    launch: Launch
    start_s: float | None = None
    """Trace time it started; None = it starts in the current decision round (so after every
    job now waiting arrived)."""
    promoted: bool = False
    """An opportunistic launch gpushare has since promoted to guaranteed."""
    pause: Pause | None = None
    """Set while gpushare has it paused (its process stopped; trace time in ``since``)."""
    resumed_s: float | None = None
    """Trace time gpushare last resumed it (the governor lets it settle again)."""

    @property
    def opportunistic(self) -> bool:
        return self.launch.opportunistic and not self.promoted


@dataclass(frozen=True)
class Verdict:
    """The governor's decision for the GPU: pause ``job``."""

    job: str
    reason: str
    beside: tuple[str, ...] = ()
    """The jobs it was judged beside: it is resumed once they are gone (``Pause.beside``)."""


class Scheme:
    """Base: subclasses decide ``select``; ``mps`` says whether clients use the MPS daemon."""

    name = "scheme"
    mps = False
    description = ""

    def select(self, pending: Sequence[TraceJob], running: Sequence[Running]) -> list[Launch]:
        raise NotImplementedError

    def prepare(self, job: TraceJob) -> list[Launch]:
        """Every setting ``job`` may start with, known before it starts (a process is warmed
        up with each); ``select`` launches it with one of them."""
        return [Launch(job)]

    def finished(self, job: TraceJob) -> None:
        """Called when ``job`` ends (successfully or not)."""

    def promotions(self, running: Sequence[Running], pending: Sequence[TraceJob] = ()) -> list[str]:
        """Opportunistic jobs (ids) to promote to guaranteed now (gpushare's accounting), with
        the jobs still waiting to start."""
        return []

    def resumptions(self, running: Sequence[Running]) -> list[str]:
        """Paused jobs (ids) to resume now (``Opportunism.resumptions``)."""
        return []

    def review(
        self, running: Sequence[Running], measured: GpuProfile, now: float
    ) -> Verdict | None:
        """A running job to pause, why, and the jobs it was judged beside, after the GPU's
        counters over the last window (``measured``, the product's profile of it) at trace
        time ``now``."""
        return None


class ExclusiveFifo(Scheme):
    name = "exclusive"
    description = "one job at a time in arrival order, whole GPU, no MPS"

    def select(self, pending: Sequence[TraceJob], running: Sequence[Running]) -> list[Launch]:
        if running or not pending:
            return []
        return [Launch(pending[0])]


class TimeSlice(Scheme):
    name = "timeslice"
    description = "every job starts on arrival, no MPS (the driver time-slices contexts)"

    def select(self, pending: Sequence[TraceJob], running: Sequence[Running]) -> list[Launch]:
        return [Launch(j) for j in pending]


class MpsUnlimited(Scheme):
    name = "mps_unlimited"
    mps = True
    description = "every job starts on arrival as an MPS client with 100% threads"

    def select(self, pending: Sequence[TraceJob], running: Sequence[Running]) -> list[Launch]:
        return [Launch(j) for j in pending]


class MpsEqual(Scheme):
    name = "mps_equal"
    mps = True

    def __init__(self, slots: int = 4) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = slots
        self.description = (
            f"NVIDIA device-plugin style: {slots} MPS replicas of {100 // slots}% threads each, "
            "jobs wait for a free replica in arrival order"
        )

    def prepare(self, job: TraceJob) -> list[Launch]:
        return [Launch(job, thread_percent=100 // self.slots)]

    def select(self, pending: Sequence[TraceJob], running: Sequence[Running]) -> list[Launch]:
        free = self.slots - len(running)
        return [Launch(j, thread_percent=100 // self.slots) for j in pending[: max(free, 0)]]


Decide = Callable[[TraceJob, Sequence[Running]], Launch | str]
"""A placement policy: a Launch when the job may start now beside ``running``, else why not."""
Prepare = Callable[[TraceJob], list[Launch]]
"""The settings a policy may give a job, before knowing its neighbours."""


Promote = Callable[[Sequence[Running], Sequence[TraceJob]], list[str]]
"""Opportunistic jobs the policy promotes to guaranteed now, given the jobs waiting to start."""
Resume = Callable[[Sequence[Running]], list[str]]
"""Paused jobs the policy resumes now."""
Review = Callable[[Sequence[Running], GpuProfile, float], Verdict | None]
"""The policy's governor: a job to pause after a window of the GPU's counters, or None."""


class Gpushare(Scheme):
    """gpushare's placement: in queue order with backfilling (as kube-scheduler retries
    pending pods), the product admits or holds each job and sets its cap and priority; with
    ``promote``, ``resume`` and ``govern`` (the opt-in run) it also promotes, pauses, resumes
    and evicts opportunistic jobs as the controller does."""

    name = "gpushare"
    mps = True

    def __init__(
        self,
        decide: Decide,
        *,
        prepare: Prepare,
        source: str,
        name: str = "gpushare",
        promote: Promote | None = None,
        resume: Resume | None = None,
        govern: Review | None = None,
        priority: Callable[[TraceJob], int] | None = None,
    ) -> None:
        """``priority``: each pod's priority as the product sets it; pending jobs are tried in
        kube-scheduler's queue order, higher priority first, then arrival."""
        self.decide = decide
        self._prepare = prepare
        self.source = source
        self.name = name
        self._promote = promote
        self._resume = resume
        self._govern = govern
        self._priority = priority
        self.holds: list[str] = []
        self.description = f"profiles + {source}: admission, thread % and priority per job"
        if promote is not None:
            self.description += "; opportunistic placement on the rows the trace opts in"

    def promotions(self, running: Sequence[Running], pending: Sequence[TraceJob] = ()) -> list[str]:
        return self._promote(running, pending) if self._promote is not None else []

    def resumptions(self, running: Sequence[Running]) -> list[str]:
        return self._resume(running) if self._resume is not None else []

    def review(
        self, running: Sequence[Running], measured: GpuProfile, now: float
    ) -> Verdict | None:
        return self._govern(running, measured, now) if self._govern is not None else None

    def prepare(self, job: TraceJob) -> list[Launch]:
        return self._prepare(job)

    def select(self, pending: Sequence[TraceJob], running: Sequence[Running]) -> list[Launch]:
        live = list(running)
        out: list[Launch] = []
        order = list(pending)
        if self._priority is not None:
            priority = self._priority
            order.sort(key=lambda j: -priority(j))  # stable: arrival order within a priority
        for job in order:
            verdict = self.decide(job, live)
            if isinstance(verdict, Launch):
                out.append(verdict)
                live = [
                    replace(r, pause=Pause(REASON_GUARANTEED)) if r.job.id in verdict.pause else r
                    for r in live
                    if r.job.id not in verdict.evict
                ]
                live.append(Running(job, verdict))
            else:
                note = f"{job.id}: {verdict}"
                if not self.holds or self.holds[-1] != note:
                    self.holds.append(note)
        return out
