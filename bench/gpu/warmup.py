"""Which jobs of a trace start warm and which start cold: decided once per trace, before any
scheme runs, and the same for every scheme (docs/benchmarks-gpu.md, "Warm or cold").

A warm job's process is started before the trace's clock with the settings its scheme may give
it (CUDA context, model and two steps done), one process for each such setting
(``Scheme.prepare``): MPS fixes a client's thread cap, priority and memory limit when CUDA
starts, so gpushare, whose settings depend on the neighbours a job meets, warms up to a few
processes a job. Each of them holds the job's GPU memory until the job starts. Warming every
job that way ran an 80-GB GPU out of memory (issue 65), and the jobs whose warm-up failed
started cold under one scheme only. Here a job is warm for every scheme or for none:

- every job's process holds the memory of its kind (the larger of the run's measurement
  alone and the catalogue's declared figure: :func:`job_memory`), or its setting's MPS
  memory limit when that is smaller; a warm process waiting for its job holds less, what its
  kind was measured to keep once its warm-up's activations were given back (``idle_mib``,
  measured on this GPU before the plan), so of a job's processes one is counted at its
  job's memory (the one that runs) and the others at that; warm processes give back only
  where holding everything would leave a job cold (:attr:`WarmPlan.release`);
- under each scheme, the warm jobs' processes, plus every cold job running at once (the worst
  any scheme does: MPS without limits starts every job on arrival), must fit
  :data:`WARM_MEMORY_SHARE` of the GPU's memory, and under an MPS scheme be at most
  :data:`MPS_CLIENTS` processes;
- jobs join the warm set in arrival order while that holds; the others start cold under every
  scheme: their process has imported its libraries before the clock, and CUDA, the model and
  two warm-up steps run when the job starts, inside the clock.

A trace whose jobs together do not fit the GPU gets no warm job at all (its cold jobs alone may
already fill it under a scheme that starts them all).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.gpu.traces import TraceJob

WARM_MEMORY_SHARE = 0.85
"""Share of the GPU's memory warm processes and running jobs may fill together: the rest is
for the MPS server, allocator fragmentation and what NVML does not list per process."""
MPS_CLIENTS = 48
"""Client processes one MPS server takes (driver 580: the 49th is refused)."""


@dataclass(frozen=True)
class SchemeNeed:
    """What one scheme would warm for each job: the MPS memory limit (MiB, None: none) of
    each process its ``prepare`` lists."""

    name: str
    mps: bool
    limits_mib: Mapping[str, Sequence[int | None]]
    """Job id -> one entry per setting the job may start with under this scheme."""


@dataclass(frozen=True)
class WarmPlan:
    """The decision for one trace, recorded in the results (``details.warm_plans``)."""

    warm: tuple[str, ...]
    """Job ids started warm under every scheme, in arrival order."""
    cold: tuple[str, ...]
    """Job ids started cold under every scheme."""
    memory_mib: Mapping[str, int]
    """The memory counted for each job's process."""
    memory_source: Mapping[str, str]
    """Per kind: ``measured`` (this run, alone) or ``declared`` (the catalogue)."""
    usable_mib: int
    idle_mib: Mapping[str, int] = field(default_factory=dict)
    """The memory counted for each of a warm job's processes but the one that runs."""
    release: bool = False
    """Warm processes give their warm-up's activations back (counted at ``idle_mib``): only
    where holding them would have left a job cold."""
    worst_mib: Mapping[str, int] = field(default_factory=dict)
    """Per scheme: the warm processes plus every cold job at once, under this plan."""
    why_cold: Mapping[str, str] = field(default_factory=dict)

    def is_warm(self, job_id: str) -> bool:
        return job_id in self.warm

    def to_json(self) -> dict[str, Any]:
        return {
            "warm": list(self.warm),
            "cold": list(self.cold),
            "memory_mib": dict(self.memory_mib),
            "memory_source": dict(self.memory_source),
            "usable_mib": self.usable_mib,
            "idle_mib": dict(self.idle_mib),
            "release": self.release,
            "worst_mib": dict(self.worst_mib),
            "why_cold": dict(self.why_cold),
        }


def job_memory(
    jobs: Sequence[TraceJob], *, measured: Mapping[str, int], declared: Mapping[str, int]
) -> tuple[dict[str, int], dict[str, str]]:
    """Each job's process memory (MiB) and, per kind, where the figure came from: the larger
    of the run's measurement alone (phase A) and the catalogue's declared figure. The run
    measures an MPS client, whose CUDA context the MPS server holds; a process outside MPS
    holds its own, as the declared figures (measured outside MPS) do. A kind with neither is
    refused: the plan cannot bound it."""
    memory: dict[str, int] = {}
    source: dict[str, str] = {}
    for job in jobs:
        mine, listed = int(measured.get(job.kind) or 0), int(declared.get(job.kind) or 0)
        if not mine and not listed:
            raise ValueError(
                f"{job.id}: no memory figure for kind {job.kind!r}; measure it alone (phase A) "
                "or declare memory_mib in bench/gpu/catalog.py"
            )
        memory[job.id] = max(mine, listed)
        source[job.kind] = "measured" if mine >= listed else "declared"
    return memory, source


def plan(
    jobs: Sequence[TraceJob],
    *,
    needs: Sequence[SchemeNeed],
    memory_mib: Mapping[str, int],
    memory_source: Mapping[str, str],
    gpu_memory_mib: int,
    idle_mib: Mapping[str, int] | None = None,
) -> WarmPlan:
    """The warm and cold jobs of one trace under every scheme in ``needs`` (module doc).
    ``idle_mib``: job id -> what a warm process of it holds waiting once it gives its
    activations back (a job without one: its job's memory). Used only where holding everything
    would leave a job cold; then the plan's :attr:`WarmPlan.release` says the warm processes
    must give back."""
    if idle_mib:
        whole = plan(jobs, needs=needs, memory_mib=memory_mib, memory_source=memory_source,
                     gpu_memory_mib=gpu_memory_mib)  # fmt: skip
        if not whole.cold:
            return whole  # every job warm holding all it used: nothing to give back
    usable = int(gpu_memory_mib * WARM_MEMORY_SHARE)
    ordered = sorted(jobs, key=lambda j: (j.arrival_s, j.id))
    idle = {j.id: min(memory_mib[j.id], (idle_mib or {}).get(j.id, memory_mib[j.id]))
            for j in ordered}  # fmt: skip

    def held(need: SchemeNeed, job: TraceJob) -> list[int]:
        """Each of the job's warm processes under ``need``: the largest at its memory (the
        one that runs), the others as they wait."""
        limits = need.limits_mib.get(job.id, ())
        each = sorted((memory_mib[job.id] if cap is None else min(memory_mib[job.id], cap)
                       for cap in limits), reverse=True)  # fmt: skip
        return each[:1] + [min(m, idle[job.id]) for m in each[1:]]

    def worst(warm: set[str]) -> dict[str, tuple[int, int]]:
        """Per scheme: (memory, processes) with ``warm`` warm and every cold job running."""
        out = {}
        for need in needs:
            memory = processes = 0
            for job in ordered:
                if job.id in warm:
                    each = held(need, job)
                    memory += sum(each)
                    processes += len(each)
                else:
                    memory += memory_mib[job.id]
                    processes += 1
            out[need.name] = (memory, processes)
        return out

    def refusal(warm: set[str]) -> str | None:
        for need in needs:
            memory, processes = worst(warm)[need.name]
            if memory > usable:
                return f"{need.name} would hold {memory} MiB (usable {usable})"
            if need.mps and processes > MPS_CLIENTS:
                return f"{need.name} would run {processes} MPS clients (at most {MPS_CLIENTS})"
        return None

    warm: set[str] = set()
    why: dict[str, str] = {}
    everything = refusal(warm)
    for job in ordered:
        if everything is not None:
            why[job.id] = f"the trace's jobs together do not fit: {everything}"
            continue
        no = refusal(warm | {job.id})
        if no is None:
            warm.add(job.id)
        else:
            why[job.id] = f"warming it too: {no}"
    return WarmPlan(
        warm=tuple(j.id for j in ordered if j.id in warm),
        cold=tuple(j.id for j in ordered if j.id not in warm),
        memory_mib=dict(memory_mib),
        memory_source=dict(memory_source),
        usable_mib=usable,
        idle_mib={j: m for j, m in idle.items() if m < memory_mib[j]},
        release=any(m < memory_mib[j] for j, m in idle.items()),
        worst_mib={name: m for name, (m, _) in worst(warm).items()},
        why_cold=why,
    )
