"""gpushare's decisions for the benchmark's one GPU, made by the product's own functions.

Each queued job is a pod: a ``Demand`` with its request (``gpushare.io/gpu-fraction``), its
limit (``gpushare.io/gpu-limit``, when its trace sets one), its class and the solo profile
gpushare's profiler measured earlier in the run; each running job is a ``Tenant`` with the cap
it was given. Whether it starts now, and how, is decided exactly where a cluster decides it:

- placement, thread cap, memory limit and admission: ``gpushare.packing.placer.Placer`` with
  the gpushare policy and the controller's default ``Admission`` (the shipped interference model
  ``gpushare/packing/data/interference.json`` and its class bounds) on a node of this one GPU:
  ``choose_gpus`` is what the extender's bind runs, ``refusal`` what its filter answers;
- the client's environment (MPS or not, active-thread %, priority, pinned memory):
  ``gpushare.node.mps.client``, what the device plugin writes from the placement;
- with ``opportunism`` (the run with the trace's opt-in rows honoured): where an opted-in job
  goes beyond the GPU's guaranteed capacity, which opportunistic jobs a guaranteed one
  preempts (``Placer.choose_gpus``, ``gpushare.packing.opportunistic``), which are promoted
  (``Opportunism.promotions``), and which the governor backs off after measuring the GPU
  (``gpushare.packing.governor.review``), what the controller's promotion and governor
  loops run.

Nothing here decides; this module only turns trace jobs into the product's inputs and its
answers into launches (docs/benchmarks-gpu.md, "Who decides").
"""

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

from bench.gpu.schemes import Launch, Running, Verdict
from bench.gpu.traces import TraceJob
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import (
    CLASS_LATENCY,
    MPS_PRIORITY_BY_CLASS,
    OPPORTUNISTIC_PRIORITY,
    SLICES_PER_GPU,
)
from gpushare.api.profile import GpuProfile
from gpushare.api.request import GpuRequest
from gpushare.cluster.webhook.facts import ClusterFacts
from gpushare.cluster.webhook.review import resolve_opt_in
from gpushare.node.mps.client import MiB, client_limits_env, runs_under_mps
from gpushare.packing.admission import DEFAULT_BOUNDS, Admission
from gpushare.packing.fit import demand_memory
from gpushare.packing.governor import review
from gpushare.packing.interference import InterferenceModel, load_default
from gpushare.packing.model import Assignment, Demand, GpuState, NodeState, PipeProfile, Tenant
from gpushare.packing.opportunistic import Opportunism
from gpushare.packing.opportunistic_memory import memory_steps
from gpushare.packing.placer import Placer
from gpushare.packing.policy import Policy
from gpushare.packing.promotion import Waiting
from gpushare.packing.stored_profile import measured_pipe_profile
from gpushare.packing.threads import assign_thread_percent

MODEL_FILE = "gpushare/packing/data/interference.json"
GPU_UUID = "bench-gpu"
_PROBE = Tenant("bench/latency-probe", 1, 0, gpu_class=CLASS_LATENCY)
"""A stand-in latency tenant: the caps a job may get are those for an empty GPU and for one
holding a latency pod (``threads.assign_thread_percent``)."""

DECIDED_BY: dict[str, str] = {
    "placement": "gpushare.packing.placer.Placer.choose_gpus (policy gpushare), refusals from "
    "Placer.refusal, as the extender's bind and filter",
    "admission": "gpushare.packing.admission.Admission (inside the Placer; "
    "gpushare.packing.admission.admit_reason with the controller's default bounds)",
    "thread_cap": "gpushare.packing.threads.assign_thread_percent (inside choose_gpus)",
    "client_env": "gpushare.node.mps.client.runs_under_mps and client_limits_env (MPS or not, "
    "active-thread %, priority by class, pinned memory), as the device plugin writes them",
    "profiles": "gpushare.node.exporter.profiler over the gpushare.node.gpu.nvml backend",
    "request": "the trace row's fraction, else fraction auto: "
    "gpushare.packing.sizing.suggested_percent of the job's solo profile",
    "opportunistic": "gpushare.packing.opportunistic.Opportunism (inside the Placer: where an "
    "opted-in job goes beyond guaranteed capacity, preemptions for guaranteed jobs, "
    "promotions) and gpushare.packing.governor.review (measured back-off and the online "
    "corrections), in the opt-in run only",
}


def model_identity() -> dict[str, Any]:
    """The shipped model file: path, sha256 of its bytes, its ``source`` and size."""
    raw = resources.files("gpushare.packing").joinpath("data/interference.json").read_bytes()
    model = load_default()
    return {
        "file": MODEL_FILE,
        "sha256": hashlib.sha256(raw).hexdigest(),
        "source": model.source,
        "records": model.records,
        "coefficients": dict(zip(model.feature_names, model.coefficients, strict=True)),
    }


@dataclass
class ProductDecider:
    """``schemes.Decide`` for the gpushare scheme (see the module doc)."""

    profiles: Mapping[str, PipeProfile]
    gpu_model: str
    gpu_memory_bytes: int
    model: InterferenceModel = field(default_factory=load_default)
    bounds: Mapping[str, float] = field(default_factory=lambda: DEFAULT_BOUNDS)
    policy: Policy = Policy.GPUSHARE
    opportunism: Opportunism | None = None
    """The opportunistic rules, with the corrections this run learns (the controller's
    governor learns on every shared GPU, whether or not a pod there opted in)."""
    honour_opt_in: bool = True
    """False: the trace's opt-in column is ignored (the chart's default, no pod opts in) while
    the governor still learns (:meth:`review`)."""
    opportunistic_default: bool = False
    """The chart's ``controller.opportunistic.default``: a row that leaves its fraction to
    gpushare (``fraction: auto``) and states no opt-in opts in, as the webhook decides it
    (``gpushare.cluster.webhook.review.resolve_opt_in``)."""
    peaks: Mapping[str, int] = field(default_factory=dict)
    """Each kind's peak GPU memory (bytes) measured while it ran alone, as a GpuShare's profile
    carries it (``memory_used_bytes_max``, read by the operator's profiler): opportunistic
    placement may give a pod what it was seen to need (``opportunistic_memory.memory_steps``)."""

    @property
    def placer(self) -> Placer:
        """The extender's decision object with the controller's defaults (admission on)."""
        return Placer(
            self.policy,
            admission=Admission(self.model, self.bounds),
            opportunism=self.opportunism,
        )

    def demand(self, job: TraceJob) -> Demand:
        return Demand(
            percent=job.percent,
            limit_percent=job.limit_percent,
            memory_bytes=job.memory_bytes,
            gpu_class=job.gpu_class,
            profile=self.profiles.get(job.kind),
            opportunistic=self.opted_in(job) and self.opportunism is not None,
            workload=job.kind,
            peak_memory_bytes=self.peaks.get(job.kind),
        )

    def opted_in(self, job: TraceJob) -> bool:
        """The row's opt-in (when honoured), else the cluster's default as the webhook applies
        it to a pod whose request gpushare sized."""
        if job.opportunistic and self.honour_opt_in:
            return True
        if not self.opportunistic_default:
            return False
        asked = GpuRequest(
            percent=job.percent,
            memory_bytes=job.memory_bytes,
            gpu_class=job.gpu_class,
            sized=not job.fixed_request,
        )
        resolved, _ = resolve_opt_in(asked, facts=ClusterFacts(opportunistic_default=True))
        return bool(resolved.opportunistic)

    def priority(self, job: TraceJob) -> int:
        """The pod priority the webhook gives ``job``: the chart's opportunistic PriorityClass
        when it opted in (``gpushare.api.names.OPPORTUNISTIC_PRIORITY``), else the default 0."""
        return OPPORTUNISTIC_PRIORITY if self.demand(job).opportunistic else 0

    def gpu(self, running: Sequence[Running], *, extra: Sequence[Tenant] = ()) -> GpuState:
        gpu = GpuState(uuid=GPU_UUID, memory_bytes=self.gpu_memory_bytes, model=self.gpu_model)
        for r in running:
            d = self.demand(r.job)
            memory = demand_memory(d, gpu)
            if r.launch.opportunistic and r.launch.memory_limit_mib is not None:
                memory = r.launch.memory_limit_mib * MiB  # what it was given beside the others
            gpu.tenants.append(
                Tenant(
                    key=r.job.id,
                    percent=min(d.percent, SLICES_PER_GPU),
                    memory_bytes=memory,
                    gpu_class=d.gpu_class,
                    profile=d.profile,
                    thread_percent=r.launch.thread_percent or SLICES_PER_GPU,
                    opportunistic=r.opportunistic,
                    workload=r.job.kind,
                    placed_at=r.start_s if r.start_s is not None else float("inf"),
                    opted_in=d.opportunistic,
                    pause=r.pause,
                )
            )
        gpu.tenants.extend(extra)
        return gpu

    def node(self, gpu: GpuState) -> NodeState:
        return NodeState(name="bench-node", gpus=[gpu])

    def __call__(self, job: TraceJob, running: Sequence[Running]) -> Launch | str:
        gpu = self.gpu(running)
        node = self.node(gpu)
        demand = self.demand(job)
        placer = self.placer
        assignment = placer.choose_gpus(node, demand)
        if assignment is None:
            return placer.refusal(node, demand) or "no GPU fits"
        return self.launch(job, demand, assignment)

    def launch(self, job: TraceJob, demand: Demand, assignment: Assignment) -> Launch:
        """The launch the device plugin's answer amounts to for this placement."""
        request = min(demand.percent, SLICES_PER_GPU)
        mps = runs_under_mps(
            gpus=len(assignment.gpu_uuids),
            thread_percent=assignment.thread_percent,
            requested_percent=request,
        )
        env = (
            client_limits_env(
                thread_percent=assignment.thread_percent,
                gpu_class=demand.gpu_class,
                memory_limit_bytes=assignment.memory_limit_bytes,
                gpu_memory_bytes=self.gpu_memory_bytes,
                request_percent=request,
            )
            if mps
            else {}
        )
        mps = mps or assignment.opportunistic  # beside others: always an MPS client
        if assignment.opportunistic:
            env = client_limits_env(
                thread_percent=assignment.thread_percent,
                gpu_class=demand.gpu_class,
                memory_limit_bytes=assignment.memory_limit_bytes,
                gpu_memory_bytes=self.gpu_memory_bytes,
                request_percent=request,
            )
        limit = "default" if demand.limit_percent is None else f"{demand.limit_percent}%"
        note = f"request {request}%, limit {limit}" + ("" if mps else ", whole GPU, no MPS")
        if assignment.opportunistic:
            note += f", opportunistic (predicted gain {assignment.predicted_gain:.2f} jobs/s)"
        if assignment.pause:
            note += f", pauses {', '.join(assignment.pause)}"
        if assignment.evict:
            note += f", evicts {', '.join(assignment.evict)} ({assignment.evict_reason})"
        return Launch(
            job,
            thread_percent=assignment.thread_percent if mps else None,
            priority=MPS_PRIORITY_BY_CLASS[demand.gpu_class] if mps else None,
            memory_limit_mib=max(1, assignment.memory_limit_bytes // MiB) if mps else None,
            note=note,
            env=env,
            mps=mps,
            opportunistic=assignment.opportunistic,
            opted_in=demand.opportunistic,
            pause=assignment.pause,
            evict=assignment.evict,
            gain=assignment.predicted_gain,
        )

    def promotions(self, running: Sequence[Running], pending: Sequence[TraceJob] = ()) -> list[str]:
        """Opportunistic jobs whose request now fits among the guaranteed shares and that no
        job ``pending`` since before them needs the room of (the controller's promotion loop
        runs the same function, with the pods its filter found no room for)."""
        if self.opportunism is None or not self.honour_opt_in:
            return []
        waiting = [Waiting(j.id, self.demand(j), j.arrival_s) for j in pending]
        return self.opportunism.promotions(self.gpu(running), waiting)

    def resumptions(self, running: Sequence[Running]) -> list[str]:
        """Paused jobs the GPU has room for again (the controller's resumption round runs the
        same function)."""
        if self.opportunism is None or not self.honour_opt_in:
            return []
        return self.opportunism.resumptions(self.gpu(running))

    def review(
        self,
        running: Sequence[Running],
        measured: GpuProfile,
        now: float,
        *,
        settle_s: float,
    ) -> Verdict | None:
        """The governor's verdict on the GPU after a window of its counters (the controller's
        governor loop runs ``gpushare.packing.governor.review`` the same way): a job to pause."""
        if self.opportunism is None:
            return None
        try:
            reading = measured_pipe_profile(measured)  # as the controller's governor reads it
        except InvalidInputError:
            return None
        resumed = {r.job.id: r.resumed_s for r in running if r.resumed_s is not None}
        verdict = review(
            self.gpu(running),
            reading,
            self.opportunism,
            now=now,
            settle_s=settle_s,
            resumed=resumed,
        )
        if verdict.pause is None:
            return None
        return Verdict(verdict.pause, verdict.reason, verdict.beside)

    def variants(self, job: TraceJob, *, beside_latency: bool = True) -> list[Launch]:
        """Every launch ``job`` may get: on an idle GPU and, unless ``beside_latency`` is False
        (its trace holds no latency pod), on one holding a latency pod (the cap depends on
        nothing else), so its process can be warmed up with each in advance."""
        demand = self.demand(job)
        out: list[Launch] = []
        for extra in ((), (_PROBE,)) if beside_latency else ((),):
            gpu = self.gpu([], extra=extra)
            assignment = self.placer.choose_gpus(self.node(gpu), demand)
            if assignment is None:
                continue
            launch = self.launch(job, demand, assignment)
            if not any(launch.same_settings(o) for o in out):
                out.append(launch)
        if demand.opportunistic:
            # Beyond guaranteed capacity it runs at its own cap (an idle GPU's, or the one
            # beside a latency pod) with one of a few memory caps. Run 31 (H200) warmed only
            # the idle GPU's cap: three opportunistic jobs placed beside the latency pod
            # started cold under that scheme alone (docs/benchmarks-gpu.md, "Run 31").
            trial = replace(demand, percent=min(demand.percent, SLICES_PER_GPU - 1))
            for extra in ((), (_PROBE,)) if beside_latency else ((),):
                threads = assign_thread_percent(trial, self.gpu([], extra=extra))
                for memory in memory_steps(demand, self.gpu_memory_bytes):
                    opportunistic = Assignment(
                        "bench-node", (GPU_UUID,), threads, memory, opportunistic=True
                    )
                    launch = self.launch(job, demand, opportunistic)
                    if not any(launch.same_settings(o) for o in out):
                        out.append(launch)
        return out
