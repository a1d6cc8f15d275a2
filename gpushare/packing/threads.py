"""The MPS active-thread percentage a pod gets: its request guaranteed, its limit as the cap.

A pod's ``percent`` is its request, what it is guaranteed (admission adds these up to at most
100); its thread cap is its limit, how many SMs its kernels may spread over when neighbours
leave room (``gpushare.io/gpu-limit``, like a Kubernetes CPU limit; docs/packing.md, "Requests
and limits"). MPS fixes the cap for a process's life, so the cap written at bind is the one it
runs with, alone or not. Hence, for a fractional batch pod:

- the default limit is the whole GPU: a batch job alone, or beside idle neighbours, is not
  throttled (a static cap at its request slowed a job that had the GPU to itself; figures in
  docs/benchmarks-gpu.md);
- an explicit ``gpushare.io/gpu-limit`` is honoured, never below the request;
- placed on a GPU that holds a latency-class pod, the cap is at most
  ``max(request, LATENCY_NEIGHBOUR_THREADS)``: the latency pod runs uncapped at MPS priority 0
  and half the SMs stay out of its batch neighbours' reach (measured: docs/benchmarks-gpu.md,
  latency target). A batch pod that started first keeps the cap it started with
  (:func:`over_latency_cap`): an opportunistic one is paused while a latency pod is there
  (``opportunistic.Opportunism.preemptions``).

Latency-class pods and whole GPUs get 100. Caps may overlap: guaranteed shares, not caps, add
up to at most 100, and admission (``admission.admit_reason``) keeps each tenant's predicted
slowdown within its class bound.
"""

from gpushare.api.names import CLASS_LATENCY, SLICES_PER_GPU
from gpushare.api.profile import PLACEMENT_COUNTERS, WORK_PIPES
from gpushare.packing.model import Demand, GpuState, PipeProfile, Tenant

HEADROOM = 1.25
"""Requests sized from a profile stay at least this factor above the measured demand."""
LATENCY_NEIGHBOUR_THREADS = 50
"""Thread cap (GPU-percent) for a batch pod placed beside a latency-class pod, unless its
request is larger (it always gets what it is guaranteed): MPS priority alone does not keep the
latency pod's tail (docs/packing.md, "Where the constants come from")."""
MIN_BATCH_THREADS = LATENCY_NEIGHBOUR_THREADS
"""A batch pod kept to this many threads (or to this share of busy SMs, see
``admission.SHIELDED``) leaves the latency pod half the GPU."""
SATURATING = 0.8
"""A pipe (or SM utilization) busier than this alone marks a job that saturates the GPU."""


def compute_demand(profile: PipeProfile) -> float:
    """Share of the GPU (0-1) the job keeps busy when alone: its busiest of SM occupancy,
    pipes, DRAM. (Occupancy, not SM utilization: this is what its neighbours feel.)"""
    return max(0.0, *(float(getattr(profile, counter)) for counter in PLACEMENT_COUNTERS))


def pipe_saturating(profile: PipeProfile) -> bool:
    """True for a job that alone keeps a compute pipe almost fully busy (an FP64 or tensor
    GEMM): uncapped, it starves every neighbour."""
    return max(float(getattr(profile, pipe)) for pipe in WORK_PIPES) >= SATURATING


def assign_thread_percent(demand: Demand, gpu: GpuState) -> int:
    """MPS active-thread % for the pod placed on ``gpu`` now; always 1..100 (rules in the
    module doc). It depends on the pod's request, limit and class and on whether ``gpu``
    already holds a latency-class pod; the device plugin sets it once, when the pod's
    containers start."""
    return thread_cap(
        demand.percent,
        limit=demand.limit_percent,
        gpu_class=demand.gpu_class,
        latency_neighbour=gpu.has_latency_tenant,
    )


def thread_cap(percent: int, *, limit: int | None, gpu_class: str, latency_neighbour: bool) -> int:
    """:func:`assign_thread_percent` from its parts: a request of ``percent`` with ``limit``
    (None: the whole GPU) in ``gpu_class``, on a GPU that holds a latency-class pod or not."""
    share = max(1, min(percent, SLICES_PER_GPU))
    if gpu_class == CLASS_LATENCY or share >= SLICES_PER_GPU:
        return SLICES_PER_GPU
    cap = max(share, min(SLICES_PER_GPU if limit is None else limit, SLICES_PER_GPU))
    if latency_neighbour:
        cap = min(cap, max(share, LATENCY_NEIGHBOUR_THREADS))
    return cap


def tenant_threads(tenant: Tenant) -> int:
    """The thread cap ``tenant`` was placed with (its percent where none was recorded)."""
    return tenant.thread_percent if tenant.thread_percent is not None else tenant.percent


def over_latency_cap(tenant: Tenant) -> bool:
    """``tenant`` runs with more threads than a batch pod placed beside a latency-class pod gets
    (:func:`thread_cap`): it started before the latency pod came, and MPS keeps a process's
    cap for its life, so it reaches SMs the cap keeps free for the latency pod's tail."""
    threads = tenant_threads(tenant)
    allowed = thread_cap(
        tenant.percent, limit=threads, gpu_class=tenant.gpu_class, latency_neighbour=True
    )
    return threads > allowed
