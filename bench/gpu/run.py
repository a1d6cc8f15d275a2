"""Benchmark job mixes on one real GPU: gpushare vs exclusive FIFO, time-slicing and MPS without
limits (equal-split MPS as context); the interference model on packs it was not fit on.

    PYTHONPATH=. python3 -m bench.gpu.run --out DIR [--trace FILE ...] [--budget-s S]

Every gpushare decision (placement, thread cap, MPS priority, admission) comes from the product
with its shipped interference model (``decide.ProductDecider``); nothing is fit on the run's
own packs to decide. One invocation, within ``--budget-s``:

A. MPS on: each job kind alone (solo rate + profile from gpushare's profiler), packs at several
   thread caps, the kinds the model never saw beside the others, the packs gpushare forms.
B. MPS off: every trace under exclusive FIFO.
C. MPS on: every trace three ways under gpushare: the chart's defaults, the opt-in on the rows
   the trace marks ``opportunistic`` (``gpushare_opportunistic``: opportunistic placement,
   promotion, preemption and the governor on the GPU's counters), and the opt-in on every
   batch row (``gpushare_opportunistic_all``); under MPS without limits; inference beside
   training; then, while the budget lasts, the context runs (equal-split MPS, time-slicing).

Before any scheme runs, each trace's jobs are split once into warm and cold ones, the same for
every scheme (``warmup.plan``); a trace's clock never waits for a process to start
(``runner.drive``). ``--plan`` prints the runs and the seconds they are expected to take, and
does nothing else.

A trace file (``--trace``, JSON or CSV) is checked before any GPU work. Writes gpu-packing.json,
gpu-packing.md, colocations.json and run.log into ``--out``, rewriting the results after every
run so a run cut short keeps what it measured.
"""

import argparse
import datetime as dt
import json
import logging
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from bench.gpu import (
    colocate,
    latency,
    model_eval,
    repeatability,
    report,
    sizing,
    traces,
    warmup,
)
from bench.gpu.catalog import KINDS, SOLO_ONLY_KINDS, TRAINING_KINDS, UNSEEN_KINDS
from bench.gpu.colocate import Member, PackResult, Stage
from bench.gpu.decide import DECIDED_BY, DEFAULT_BOUNDS, ProductDecider, model_identity
from bench.gpu.gpm import Sampler, to_profile, with_kernel_time
from bench.gpu.metrics import JobResult, summarize
from bench.gpu.mps import MpsDaemon
from bench.gpu.procs import WorkerError, Workers
from bench.gpu.runner import (
    INIT_TIMEOUT_S,
    SPAWN_TIMEOUT_S,
    Governing,
    Pool,
    measure_stages,
    run_trace,
    safe,
    warm_launches,
)
from bench.gpu.schemes import (
    ExclusiveFifo,
    Gpushare,
    Launch,
    MpsEqual,
    MpsUnlimited,
    Running,
    Scheme,
    TimeSlice,
)
from bench.gpu.sizing import pipe_profile
from gpushare.api.names import CLASS_LATENCY
from gpushare.api.profile import PLACEMENT_COUNTERS, GpuProfile
from gpushare.packing.opportunistic import Opportunism

log = logging.getLogger("bench.gpu")

PHASE_A_SHARE = 0.28
"""Share of the budget the colocation stages may take."""
OPPORTUNISTIC = report.OPPORTUNISTIC
OPPORTUNISTIC_ALL = report.OPPORTUNISTIC_ALL
GOVERNOR_PERIOD_S = 0.5
GOVERNOR_WINDOW_S = 0.6
GOVERNOR_SETTLE_S = 1.0
"""The governor's timing here: the benchmark's jobs last 2-3 s, so it judges a tenant after
1 s on windows of 0.6 s every 0.5 s, where a controller (jobs of hours) waits 30 s on windows
of tens of seconds. The rule is the product's (``gpushare.packing.governor.review``)."""
STARTUP_S = 15.0
"""Seconds a trace run spends starting and warming up its processes, before its clock, and
closing them after it: with it the expected seconds of run 25's runs add up to 581 s, where
run 25 took 569 s (docs/benchmarks-gpu.md, "The batch run")."""
SOLO_WINDOW_S = 2.0
"""Each kind alone in phase A: its rate, its profile and its memory."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.gpu.run",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="directory for results and logs")
    p.add_argument(
        "--trace",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="a trace file (JSON or CSV rows of arrival_s, kind, work_s[, fraction, limit, "
        "memory, opportunistic]); repeat for several; default: every shipped trace",
    )
    p.add_argument(
        "--traces",
        default="",
        metavar="NAMES",
        help="shipped traces to run, comma-separated (default: all of them unless --trace is "
        f"given): {', '.join(traces.SHIPPED)}",
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="print the runs, their expected seconds and whether the budget holds them; no "
        "GPU work",
    )
    p.add_argument("--quick", action="store_true", help="shorter jobs, fewer packs (~4 min)")
    p.add_argument("--gpu", type=int, default=0, help="GPU index (default 0)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="wall-clock budget; packs are trimmed and context runs skipped to fit "
        "(default: what the comparisons of the chosen traces need, --plan says how much; "
        "quick 300; on a GPU lent for at most 10 minutes a command, run fewer --traces at a "
        "time, resumed from a stored phase A: docs/benchmarks-gpu.md)",
    )
    p.add_argument("--slots", type=int, default=4, help="replicas of equal-split MPS (100/N%%)")
    p.add_argument(
        "--latency-rounds",
        type=int,
        default=6,
        help="rounds of the reported latency windows (a multiple of 3 balances the order); "
        "0 skips the latency stage",
    )
    p.add_argument("--code-rev", default="", help="the code's revision, recorded in the results")
    p.add_argument(
        "--phase",
        choices=("all", "colocations"),
        default="all",
        help="colocations: phase A only (profiles, packs), saved to phase-a.json for --resume",
    )
    p.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="FILE",
        help="phase A's phase-a.json from an earlier invocation on the same GPU: run the rest "
        "(kinds it lacks are measured alone first); 'auto': the newest one stored in "
        "bench/gpu/data for this GPU (run*-h100-phase-a.json...), else phase A's solo stage "
        "alone (no packs)",
    )
    p.add_argument(
        "--dry",
        action="store_true",
        help="no GPU: workers sleep instead of computing; checks the harness, not a benchmark",
    )
    args = p.parse_args(argv)
    if args.slots < 1:
        p.error("--slots must be at least 1 (equal-split MPS needs one replica or more)")
    if args.latency_rounds < 0:
        p.error("--latency-rounds must be 0 (no latency stage) or more")
    if args.budget_s is not None and args.budget_s < 60:
        p.error("--budget-s below 60 s cannot fit a run; give 300 (quick) or more")
    names = [n.strip() for n in args.traces.split(",") if n.strip()]
    try:
        args.traces = traces.load_all(args.trace, names)
    except traces.TraceError as exc:
        p.error(str(exc))
    if args.budget_s is None:
        args.budget_s = 300.0 if args.quick else budget_for(args)
    return args


@dataclass
class Ctx:
    args: argparse.Namespace
    t_start: float
    tmp: Path
    gpu_name: str = "unknown"
    driver: str = "unknown"
    memory_bytes: int = 80 * 2**30
    errors: list[str] = field(default_factory=list)
    phase_a_from: str = "this invocation"

    def workers(self) -> Workers:
        return Workers(
            device="sleep" if self.args.dry else "cuda",
            tiny=False,
            log_dir=self.tmp,
            base_env={"CUDA_VISIBLE_DEVICES": str(self.args.gpu)},
        )

    def left(self) -> float:
        return float(self.args.budget_s) - (time.time() - self.t_start)

    def daemon(self) -> MpsDaemon | None:
        if self.args.dry:
            return None
        d = MpsDaemon(gpu=str(self.args.gpu))
        d.start()
        return d

    def pipe(self, daemon: MpsDaemon | None) -> Path:
        return daemon.pipe_dir if daemon else self.tmp / "no-mps"


def gpu_info(ctx: Ctx) -> None:
    if ctx.args.dry:
        ctx.gpu_name, ctx.driver = "none (dry run)", "none"
        return
    try:
        import pynvml  # noqa: PLC0415  (absent in dry runs)

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(ctx.args.gpu)
        name = pynvml.nvmlDeviceGetName(h)
        ctx.gpu_name = name.decode() if isinstance(name, bytes) else str(name)
        drv = pynvml.nvmlSystemGetDriverVersion()
        ctx.driver = drv.decode() if isinstance(drv, bytes) else str(drv)
        ctx.memory_bytes = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
        pynvml.nvmlShutdown()
    except Exception as exc:
        ctx.errors.append(f"GPU info: {exc}")


@dataclass
class State:
    """Everything measured so far; assembled into the results at every checkpoint."""

    results: list[PackResult] = field(default_factory=list)
    profiles: dict[str, dict[str, float]] = field(default_factory=dict)
    raw_profiles: dict[str, dict[str, float]] = field(default_factory=dict)
    solo: dict[str, float] = field(default_factory=dict)
    profile_source: str = "unavailable"
    fractions: dict[str, float] = field(default_factory=dict)
    chosen: dict[colocate.PackKey, colocate.PackKey] = field(default_factory=dict)
    recs: list[colocate.Record] = field(default_factory=list)
    runs: dict[str, dict[str, list[JobResult]]] = field(default_factory=dict)
    jobs: dict[str, list[traces.TraceJob]] = field(default_factory=dict)
    iterations: dict[str, dict[str, int]] = field(default_factory=dict)
    latency: dict[str, Any] = field(default_factory=dict)
    holds: dict[str, list[str]] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    exhaustive: dict[str, Any] = field(default_factory=dict)
    corrections: dict[str, float] = field(default_factory=dict)
    """What the governor learned of each job kind (``Corrections.factors``) in the opt-in runs."""
    memory: dict[str, int] = field(default_factory=dict)
    """Each kind's GPU memory in MiB after its solo window (phase A): NVML's figure for its
    process, else its allocator's peak plus :data:`CONTEXT_ALLOWANCE_MIB`."""
    idle_mib: dict[str, int] = field(default_factory=dict)
    """Each kind's GPU memory in MiB once warmed up with its activations given back, outside
    MPS (its CUDA context counted): what a warm process holds waiting (:func:`measure_idle`)."""
    warm_plans: dict[str, warmup.WarmPlan] = field(default_factory=dict)
    ways: dict[str, dict[str, str]] = field(default_factory=dict)
    """Per trace: each way it was run (``report.WAYS``) -> the scheme whose run it is."""


def _members(key: colocate.PackKey) -> tuple[Member, ...]:
    seen: dict[tuple[str, int], int] = {}
    out = []
    for kind, tp in key:
        out.append(Member(kind, tp, seen.get((kind, tp), 0)))
        seen[(kind, tp)] = seen.get((kind, tp), 0) + 1
    return tuple(out)


def make_decider(
    ctx: Ctx, st: State, *, opportunism: Opportunism | None = None, honour_opt_in: bool = True
) -> ProductDecider:
    profiles = {
        k: pipe_profile(with_kernel_time(v, st.raw_profiles.get(k)), gpu_model=ctx.gpu_name)
        for k, v in st.profiles.items()
    }
    return ProductDecider(
        profiles=profiles,
        gpu_model=ctx.gpu_name,
        gpu_memory_bytes=ctx.memory_bytes,
        opportunism=opportunism,
        honour_opt_in=honour_opt_in,
        peaks=alone_peaks(st),
    )


CONTEXT_ALLOWANCE_MIB = 1024
"""Added to a job's allocator peak where NVML did not list its process: the CUDA context and
libraries' workspaces a PyTorch process holds beyond its allocator (what NVML lists, and the
operator's profiler reads, includes them)."""


def memory_of(report: Mapping[str, Any]) -> int | None:
    """A worker's memory report in MiB: NVML's figure for its process, else the allocator's
    peak plus :data:`CONTEXT_ALLOWANCE_MIB`; None where it has neither (a dry run)."""
    held, peak = report.get("process_mib"), report.get("peak_mib")
    if isinstance(held, int | float) and held > 0:
        return int(held)
    if isinstance(peak, int | float) and peak > 0:
        return int(peak) + CONTEXT_ALLOWANCE_MIB
    return None


def alone_peaks(st: State) -> dict[str, int]:
    """Each kind's peak GPU memory in bytes while it ran alone, what the operator's profile of
    it would carry: the larger of its process after its solo window in phase A (the profiling
    window, :attr:`State.memory`) and the catalogue's declared figure (what NVML listed for it
    alone outside MPS in runs 24 and 25, which gave the peaks then), as the warm-up plan counts
    it (``warmup.job_memory``). Fixed before any trace runs, so every run of a trace sees the
    same."""
    out: dict[str, int] = {}
    for kind, spec in KINDS.items():
        mib = max(st.memory.get(kind, 0), spec.memory_mib)
        if mib:
            out[kind] = mib * (1 << 20)
    return out


def choose_pack(
    decider: ProductDecider, kinds: Sequence[str], fractions: dict[str, float]
) -> colocate.PackKey:
    """The pack gpushare forms when ``kinds`` arrive in this order at an idle GPU."""
    running: list[Running] = []
    for i, kind in enumerate(kinds):
        job = traces.TraceJob(f"s{i}-{kind}", kind, 0.0, 0.0, fractions[kind])
        verdict = decider(job, running)
        if isinstance(verdict, Launch):
            running.append(Running(job, verdict))
    return colocate.pack_key((r.job.kind, r.launch.thread_percent or 100) for r in running)


def size_and_choose(ctx: Ctx, st: State) -> list[tuple[Member, ...]]:
    """Each kind's request (``sizing.request_fraction``, the product's ``fraction: auto``) and
    the pack gpushare forms from each measured set of kinds (``st.chosen``), from the stored
    profiles and packs; returns the solo runs and packs among those not measured yet."""
    st.fractions = {
        k: sizing.request_fraction(
            st.raw_profiles.get(k) or st.profiles.get(k), gpu_class=KINDS[k].gpu_class
        )
        for k in st.solo
        if k in KINDS
    }
    log.info("requests sized from profiles: %s", st.fractions)
    decider = make_decider(ctx, st)
    recs = colocate.records(gpu=ctx.gpu_name, results=st.results, profiles=st.profiles)
    measured = {colocate.key_of(r) for r in recs}
    solo_caps = set(colocate.solo_table(st.results))
    extra: list[tuple[Member, ...]] = []
    st.chosen = {}
    for scen in colocate.scenarios(recs):
        kinds = [k for k, _ in scen]
        if any(k not in st.fractions for k in kinds):
            continue
        pick = choose_pack(decider, kinds, st.fractions)
        st.chosen[scen] = pick
        for kind, tp in pick:
            if (kind, tp) not in solo_caps:
                solo_caps.add((kind, tp))
                extra.append((Member(kind, tp),))
        if len(pick) > 1 and pick not in measured:
            measured.add(pick)
            extra.append(_members(pick))
    log.info("gpushare's packs for %d scenarios; %d to measure", len(st.chosen), len(extra))
    return extra


def record_profile(st: State, kind: str, profile: GpuProfile | None) -> None:
    """Keep ``kind``'s solo profile when every counter the product needs was measured. A GPU
    without NVML GPM (or a failed read) leaves the kind unprofiled, as gpushare's operator
    leaves a pod it cannot profile (``stored_profile.measured_pipe_profile`` refuses), never
    an all-zero profile that would read as an idle job asking 5% of the GPU."""
    missing = [k for k in PLACEMENT_COUNTERS if profile is None or profile.ratio(k) is None]
    if missing:
        log.warning("%s: not profiled (%s not measured); it is placed by its request", kind,
                    ",".join(missing))  # fmt: skip
        return
    assert profile is not None
    st.raw_profiles[kind] = {
        k: round(float(v), 4)
        for k, v in profile.to_json().items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    st.profiles[kind] = to_profile(profile)


def trace_kinds(ctx: Ctx) -> list[str]:
    return sorted({j.kind for t in ctx.args.traces for j in t.jobs})


def phase_a(ctx: Ctx, st: State, *, solo_only: Sequence[str] | None = None) -> None:
    """Profiles, colocation packs (known and unseen kinds) and the packs gpushare forms; with
    ``solo_only``, only those kinds alone (their rates, profiles and memory)."""
    quick = ctx.args.quick
    window = 0.8 if quick else 1.0
    if solo_only is not None:
        solo = tuple((Member(k, 100),) for k in dict.fromkeys(solo_only))
        stages = [Stage("solo", solo, 1.5 if quick else SOLO_WINDOW_S)]
    else:
        # The known kinds' short plan (the shipped model was fit on their full plans in
        # earlier runs), with the unseen kinds' packs before the capped stage so a tight
        # budget trims that.
        stages = colocate.plan(TRAINING_KINDS, quick=True)
        extra_kinds = [
            k
            for k in (*SOLO_ONLY_KINDS, *UNSEEN_KINDS, *trace_kinds(ctx))
            if k not in TRAINING_KINDS
        ]
        extra_solo = tuple((Member(k, 100),) for k in dict.fromkeys(extra_kinds))
        first = stages[0]
        stages[0] = Stage(first.name, (*first.packs, *extra_solo), 1.5 if quick else SOLO_WINDOW_S)
        stages = [Stage(x.name, x.packs, window) if i else x for i, x in enumerate(stages)]
        unseen = colocate.unseen_plan(UNSEEN_KINDS, TRAINING_KINDS, window=window)
        stages = [stages[0], stages[1], *unseen, *stages[2:]]
    workers = ctx.workers()
    daemon = ctx.daemon()
    sampler = None if ctx.args.dry else Sampler(index=ctx.args.gpu, period_s=0.2)
    if solo_only is None or st.profile_source == "unavailable":
        st.profile_source = sampler.source if sampler else "none (dry run)"
    pool = Pool(workers, daemon.pipe_dir if daemon else None, {})
    share = 1.0 if ctx.args.phase == "colocations" else PHASE_A_SHARE
    budget_end = time.time() + share * ctx.args.budget_s - (60 if share == 1.0 else 0)

    def on_solo(
        m: Member, start: float, end: float, rate: float, report: Mapping[str, Any] | None = None
    ) -> None:
        st.solo[m.kind] = rate
        held = memory_of(report or {})
        if held is not None:
            st.memory[m.kind] = max(held, st.memory.get(m.kind, 0))
        if sampler is not None:
            record_profile(st, m.kind, sampler.profile_last(max(0.3, end - start - 0.5)))
        else:
            st.profiles[m.kind] = to_profile(GpuProfile(sm_occupancy=0.2, fp32=0.2))

    try:
        # The solo stage first (every trace needs its kinds' rates), then the packs.
        st.results += measure_stages(
            pool=pool, stages=stages[:1], deadline=budget_end + 60, on_solo=on_solo
        )
        if solo_only is not None:
            return
        if st.profiles:
            st.results += measure_stages(
                pool=pool, stages=stages[1:], deadline=budget_end, on_solo=on_solo
            )
        else:
            ctx.errors.append(
                f"colocation packs: skipped, no job could be profiled on {ctx.gpu_name} "
                f"({st.profile_source}; gpushare profiles by NVML GPM, Hopper or newer): "
                "gpushare places by requests alone, jobs without a trace fraction ask for the "
                "whole GPU, and the model is not evaluated"
            )
            log.warning("%s", ctx.errors[-1])
        extra = size_and_choose(ctx, st)
        if extra:
            stage = Stage("gpushare-choices", tuple(extra), stages[1].window_s)
            st.results += measure_stages(
                pool=pool, stages=[stage], deadline=budget_end + 20, on_solo=on_solo
            )
    finally:
        pool.close()
        if sampler is not None:
            sampler.close()
        if daemon is not None:
            daemon.stop()


def stored_phase_a(gpu_name: str | None) -> Path | None:
    """The newest phase A stored in ``bench/gpu/data`` for this GPU model (``run16-h100-...``
    for an H100; None: for any GPU), by run number, or None."""
    short = report.short_name(gpu_name).lower() if gpu_name is not None else "*"
    found: list[tuple[int, str, Path]] = []
    for path in DATA_DIR.glob(f"run*-{short}-phase-a.json"):
        digits = "".join(c for c in path.name.split("-")[0] if c.isdigit())
        if digits:
            found.append((int(digits), path.name, path))
    return max(found)[2] if found else None


DATA_DIR = Path(__file__).resolve().parent / "data"
REPO_DIR = DATA_DIR.parents[2]


def recorded_path(path: Path) -> str:
    """``path`` as the results record it: relative to the repository where it lies inside it
    (a stored phase A), so a committed record names no machine's directories."""
    resolved = path.resolve()
    if resolved.is_relative_to(REPO_DIR):
        return str(resolved.relative_to(REPO_DIR))
    return str(path)


def evaluate_model(ctx: Ctx, st: State) -> None:
    """The shipped model on the run's packs, leave-one-kind-out, 5-fold; packs vs exhaustive."""
    if not st.recs:
        return
    st.model["shipped"] = (
        safe(lambda: model_eval.shipped(st.recs, unseen=UNSEEN_KINDS), "shipped MAPE", ctx.errors)
        or {}
    )
    st.model["calibrated"] = (
        safe(
            lambda: model_eval.calibrated(st.recs, unseen=UNSEEN_KINDS),
            "calibrated MAPE",
            ctx.errors,
        )
        or {}
    )
    st.model["leave_one_kind_out"] = (
        safe(lambda: model_eval.leave_one_kind_out(st.recs), "leave-one-kind-out", ctx.errors) or {}
    )
    st.model["repeatability"] = (
        safe(
            lambda: repeatability.repeatability(
                st.recs,
                [repeatability.load(p) for p in repeatability.stored_files()],
                unseen=UNSEEN_KINDS,
            ),
            "repeatability",
            ctx.errors,
        )
        or {}
    )
    if len(st.recs) >= 5:
        st.model["k_fold"] = {
            k: _clean(v)
            for k, v in (
                safe(
                    lambda: colocate.held_out_mape(st.recs, fit=model_eval.fitter, k=5),
                    "5-fold MAPE",
                    ctx.errors,
                )
                or {}
            ).items()
        }
    if st.chosen:
        st.exhaustive = (
            safe(
                lambda: colocate.exhaustive_comparison(
                    st.recs,
                    chosen=st.chosen,
                    solo=colocate.solo_table(st.results),
                    fractions=st.fractions,
                ),
                "exhaustive comparison",
                ctx.errors,
            )
            or {}
        )


def run_scheme(
    ctx: Ctx,
    scheme: Scheme,
    trace: str,
    st: State,
    daemon: MpsDaemon | None,
    *,
    jobs: Sequence[traces.TraceJob] | None = None,
    governing: Governing | None = None,
) -> list[JobResult] | None:
    """The jobs' results (also stored in ``st.runs``), or None when the budget left cannot fit
    the run or it failed. ``jobs``: the trace's, as this way runs them (default: as written).
    The jobs the trace's warm-up plan makes warm start warm; the others cold."""
    jobs = list(st.jobs[trace] if jobs is None else jobs)
    plan = st.warm_plans.get(trace)
    work = sum(j.work_s for j in jobs)
    timeout = max(60.0, 4 * work + 30)
    label = f"{scheme.name}, {trace}"
    need = scheme_need_s(scheme.name, work)
    if ctx.left() < need:
        ctx.errors.append(
            f"{label}: skipped, {ctx.left():.0f}s of budget left ({need:.0f}s needed)"
        )
        return None
    log.info("== %s on %s: %s", scheme.name, trace, scheme.description)
    result: list[JobResult] | None = safe(
        lambda: run_trace(
            scheme=scheme,
            jobs=jobs,
            iterations=st.iterations[trace],
            workers=ctx.workers(),
            pipe_dir=ctx.pipe(daemon) if scheme.mps else None,
            timeout_s=timeout,
            warm_ids=set(plan.warm) if plan is not None else set(),
            release=plan is not None and plan.release,
            memory_mib=plan.memory_mib if plan is not None else None,
            governing=governing,
        ),
        f"trace under {label}",
        ctx.errors,
    )
    if result:
        st.runs.setdefault(trace, {})[scheme.name] = result
    return result


def prepare_jobs(ctx: Ctx, st: State) -> None:
    for kind in KINDS:
        st.fractions.setdefault(kind, 1.0)
    for t in ctx.args.traces:
        jobs = traces.with_requests(list(t.jobs), st.fractions)
        st.iterations[t.name] = {}
        for j in jobs:
            try:
                st.iterations[t.name][j.id] = traces.iterations_for(
                    j, solo_rate=st.solo.get(j.kind, 0.0)
                )
            except ValueError as exc:
                ctx.errors.append(str(exc))
        st.jobs[t.name] = [j for j in jobs if j.id in st.iterations[t.name]]


STATE_FILE = "phase-a.json"


def dump_state(st: State) -> dict[str, Any]:
    """Phase A's measurements, for a later invocation on the same GPU (``--resume``)."""
    return {
        "results": [
            {"pack": [[m.kind, m.thread_percent, m.copy] for m in r.pack], "rates": r.rates}
            for r in st.results
        ],
        "profiles": st.profiles,
        "raw_profiles": st.raw_profiles,
        "solo": st.solo,
        "profile_source": st.profile_source,
        "fractions": st.fractions,
        "chosen": [[list(map(list, k)), list(map(list, v))] for k, v in st.chosen.items()],
        "memory_mib": st.memory,
    }


def load_state(st: State, path: Path) -> None:
    raw = json.loads(path.read_text())
    st.results = [
        PackResult(
            tuple(Member(str(k), int(t), int(c)) for k, t, c in r["pack"]),
            tuple(float(x) for x in r["rates"]),
        )
        for r in raw["results"]
    ]
    st.profiles, st.raw_profiles = raw["profiles"], raw["raw_profiles"]
    st.solo, st.fractions = raw["solo"], raw["fractions"]
    st.profile_source = raw["profile_source"]
    st.memory = {str(k): int(v) for k, v in raw.get("memory_mib", {}).items()}
    st.chosen = {
        tuple((str(k), int(t)) for k, t in key): tuple((str(k), int(t)) for k, t in pick)
        for key, pick in raw["chosen"]
    }


@dataclass(frozen=True)
class Way:
    """One scheme to run on one trace: the scheme (made fresh for its run) and the trace's
    jobs as this run has them (every batch row opted in, for the third gpushare way)."""

    trace: str
    name: str
    make: Callable[[], Scheme]
    jobs: Sequence[traces.TraceJob]


def planned_schemes(trace: str, jobs: Sequence[traces.TraceJob]) -> list[str]:
    """Every scheme run on a trace, in no particular order: exclusive FIFO, MPS without limits,
    gpushare three ways (the marked rows' way where the trace marks any, every batch row's
    where that opts in more), then the context runs (equal-split MPS, except on the heavy
    trace, whose whole-GPU jobs it would only slow down, and time-slicing)."""
    names = ["exclusive", "gpushare", "mps_unlimited"]
    if any(j.opportunistic for j in jobs):
        names.append(OPPORTUNISTIC)
    if any(not j.opportunistic and j.gpu_class != CLASS_LATENCY for j in jobs):
        names.append(OPPORTUNISTIC_ALL)
    names += [*(["mps_equal"] if trace != "heavy" else []), "timeslice"]
    return names


CONTEXT = ("mps_equal", "timeslice")
"""Schemes run only while the budget lasts: no target reads them (but a trace's best other
scheme, where they ran, may be one of them)."""


def trace_ways(
    ctx: Ctx, st: State, trace: str, *, learning: ProductDecider, opt_in: ProductDecider
) -> dict[str, Way]:
    """The schemes of :func:`planned_schemes` for one trace, ready to run."""
    jobs = st.jobs.get(trace, [])
    # A job can only start beside a latency pod in a trace that holds one: elsewhere that
    # variant's warm process would never run and only cost memory and an MPS client.
    with_service = any(j.gpu_class == CLASS_LATENCY for j in jobs)

    def gs(chosen: ProductDecider, name: str) -> Callable[[], Scheme]:
        def make() -> Scheme:
            def govern(running: Sequence[Running], measured: GpuProfile, now: float) -> Any:
                return chosen.review(running, measured, now, settle_s=GOVERNOR_SETTLE_S)

            def prepare(job: traces.TraceJob) -> list[Launch]:
                return chosen.variants(job, beside_latency=with_service)

            if name == "gpushare":
                return Gpushare(chosen, prepare=prepare, source="gpushare (product)",
                                govern=govern)  # fmt: skip
            return Gpushare(
                chosen,
                prepare=prepare,
                source="gpushare (product)",
                name=name,
                promote=chosen.promotions,
                resume=chosen.resumptions,
                priority=chosen.priority,
                govern=govern,
            )

        return make

    makers: dict[str, Callable[[], Scheme]] = {
        "exclusive": ExclusiveFifo,
        "gpushare": gs(learning, "gpushare"),
        "mps_unlimited": MpsUnlimited,
        OPPORTUNISTIC: gs(opt_in, OPPORTUNISTIC),
        OPPORTUNISTIC_ALL: gs(opt_in, OPPORTUNISTIC_ALL),
        "mps_equal": lambda: MpsEqual(ctx.args.slots),
        "timeslice": TimeSlice,
    }
    every = traces.every_batch_row_opted_in(jobs)
    return {
        name: Way(trace, name, makers[name], every if name == OPPORTUNISTIC_ALL else jobs)
        for name in planned_schemes(trace, jobs)
    }


def way_names(trace: str, jobs: Sequence[traces.TraceJob]) -> dict[str, str]:
    """Each of the three ways (``report.WAYS``) -> the scheme whose run it is on this trace:
    every batch row's way is the marked rows' where the trace marks every batch row."""
    planned = planned_schemes(trace, jobs)
    out = {report.WAYS["gpushare"]: "gpushare"}
    if OPPORTUNISTIC in planned:
        out[report.WAYS[OPPORTUNISTIC]] = OPPORTUNISTIC
    if OPPORTUNISTIC_ALL in planned:
        out[report.WAYS[OPPORTUNISTIC_ALL]] = OPPORTUNISTIC_ALL
    elif OPPORTUNISTIC in planned:
        out[report.WAYS[OPPORTUNISTIC_ALL]] = OPPORTUNISTIC
    return out


def measure_idle(ctx: Ctx, st: State, kinds: Sequence[str]) -> None:
    """What a warm process of each of ``kinds`` holds while it waits (``st.idle_mib``): one
    process per kind not yet measured, warmed up outside MPS as a trace's warm process is, its
    activations given back, read from NVML, then ended. A kind whose process fails or that
    NVML cannot read (a dry run) keeps no figure: the plan counts its full memory."""
    missing = [k for k in dict.fromkeys(kinds) if k not in st.idle_mib]
    if not missing:
        return
    workers = ctx.workers()
    try:
        started = {k: workers.spawn(f"idle.{k}", preload=k) for k in missing}
        for kind, w in started.items():
            w.send({"cmd": "init", "kind": kind, "env": {}, "release": True})
        deadline = time.monotonic() + SPAWN_TIMEOUT_S + INIT_TIMEOUT_S
        for kind, w in started.items():
            try:
                ready = workers.expect(w, "ready", timeout_s=max(1.0, deadline - time.monotonic()))
            except WorkerError as exc:
                log.warning("idle memory of %s not measured: %s", kind, exc)
                continue
            if ready.get("idle_mib"):
                st.idle_mib[kind] = int(ready["idle_mib"])
    finally:
        workers.close_all()
    log.info("memory a warm process holds waiting (MiB): %s", st.idle_mib)


def plan_warm_up(ctx: Ctx, st: State, trace: str, ways: Mapping[str, Way]) -> warmup.WarmPlan:
    """The trace's warm and cold jobs for every scheme that may run on it (``warmup.plan``),
    from each kind's memory measured alone in phase A, else declared; where that leaves a job
    cold, also from what its warm processes would hold waiting (:func:`measure_idle`)."""
    jobs = st.jobs[trace]
    memory, source = warmup.job_memory(
        jobs, measured=st.memory, declared={k: spec.memory_mib for k, spec in KINDS.items()}
    )
    needs = []
    for way in ways.values():
        scheme = way.make()
        limits = {
            j.id: [
                launch.memory_limit_mib if scheme.mps and launch.mps is not False else None
                for launch in warm_launches(scheme.prepare(j), memory_mib=memory[j.id])
            ]
            for j in way.jobs
        }
        needs.append(warmup.SchemeNeed(way.name, scheme.mps, limits))

    def planned(idle: Mapping[str, int] | None) -> warmup.WarmPlan:
        return warmup.plan(jobs, needs=needs, memory_mib=memory, memory_source=source,
                           gpu_memory_mib=ctx.memory_bytes >> 20, idle_mib=idle)  # fmt: skip

    plan = planned(None)
    if plan.cold:  # what warm processes keep once they give back, measured only where it helps
        measure_idle(ctx, st, [j.kind for j in jobs])
        plan = planned({j.id: st.idle_mib[j.kind] for j in jobs if j.kind in st.idle_mib})
    log.info("%s: warm for every scheme: %s; cold for every scheme: %s", trace,
             ", ".join(plan.warm) or "none", ", ".join(plan.cold) or "none")  # fmt: skip
    for job_id, why in plan.why_cold.items():
        log.info("  %s cold: %s", job_id, why)
    return plan


def load_phase_a(ctx: Ctx, st: State) -> None:
    """Phase A from ``--resume`` (a file, or ``auto``: the newest stored for this GPU), the
    kinds it lacks measured alone; without a stored one, the solo stage alone."""
    args = ctx.args
    path: Path | None = args.resume
    if path is not None and str(path) == "auto":
        path = stored_phase_a(ctx.gpu_name)
        if path is None:
            ctx.errors.append(
                f"--resume auto: no phase A stored for {ctx.gpu_name}; measured each kind alone "
                "(no colocation packs: the model and packing targets read not measured)"
            )
            log.warning("%s", ctx.errors[-1])
    if path is None:
        safe(lambda: phase_a(ctx, st, solo_only=trace_kinds(ctx)), "phase A (solo)", ctx.errors)
        size_and_choose(ctx, st)
        ctx.phase_a_from = "this invocation (each kind alone, no packs)"
        return
    load_state(st, path)
    ctx.phase_a_from = recorded_path(path)
    log.info("phase A from %s: %d packs", path, len(st.results))
    missing = [k for k in trace_kinds(ctx) if k not in st.solo]
    if missing:
        log.info("kinds %s are not in %s: measured alone first", missing, path)
        safe(lambda: phase_a(ctx, st, solo_only=missing), "phase A (missing kinds)", ctx.errors)
    unmeasured = size_and_choose(ctx, st)
    if unmeasured:
        log.warning(
            "resumed: %d of the packs and caps this code forms were not measured in %s; "
            "their scenarios read 'not measured' in the packs-vs-exhaustive comparison",
            len(unmeasured),
            path,
        )


def run(ctx: Ctx) -> dict[str, Any]:
    args = ctx.args
    gpu_info(ctx)
    log.info("GPU %s, driver %s, budget %.0fs", ctx.gpu_name, ctx.driver, args.budget_s)
    st = State()

    def checkpoint() -> dict[str, Any]:
        """Write what we have: a run cut short still leaves its results behind."""
        results = assemble(ctx=ctx, st=st)
        report.write(args.out, results)
        return results

    if args.resume is not None:
        load_phase_a(ctx, st)
    else:
        safe(lambda: phase_a(ctx, st), "phase A (profiles, colocations)", ctx.errors)
    (args.out / STATE_FILE).write_text(json.dumps(dump_state(st)) + "\n")
    st.recs = colocate.records(gpu=ctx.gpu_name, results=st.results, profiles=st.profiles)
    (args.out / "colocations.json").write_text(
        json.dumps(colocate.validate(st.recs), indent=1) + "\n"
    )
    evaluate_model(ctx, st)
    prepare_jobs(ctx, st)
    decider = make_decider(ctx, st)
    # One set of corrections for the run, as one controller keeps learning across its GPUs.
    opportunism = Opportunism()
    opt_in = make_decider(ctx, st, opportunism=opportunism)
    learning = make_decider(ctx, st, opportunism=opportunism, honour_opt_in=False)
    names = [t.name for t in args.traces if t.name in st.jobs]
    ways = {n: trace_ways(ctx, st, n, learning=learning, opt_in=opt_in) for n in names}
    for n in names:
        st.ways[n] = way_names(n, st.jobs[n])
        plan = safe(partial(plan_warm_up, ctx, st, n, ways[n]), f"warm-up plan of {n}",
                    ctx.errors)  # fmt: skip
        if plan is not None:  # else every job of the trace starts cold
            st.warm_plans[n] = plan
    checkpoint()
    if args.phase == "colocations":
        return checkpoint()

    def runs(
        items: Sequence[Way], daemon: MpsDaemon | None, governing: Governing | None = None
    ) -> None:
        for way in items:
            scheme = way.make()
            # The controller's governor reads every shared GPU: on the default runs it only
            # learns (no pod there opted in), and the opt-in runs start from what it learned.
            governed = governing if isinstance(scheme, Gpushare) else None
            run_scheme(ctx, scheme, way.trace, st, daemon, jobs=way.jobs, governing=governed)
            if isinstance(scheme, Gpushare):
                key = way.trace if scheme.name == "gpushare" else f"{way.trace}/{scheme.name}"
                st.holds[key] = scheme.holds[:200]
            checkpoint()

    def each(scheme: str) -> list[Way]:
        return [ways[n][scheme] for n in names if scheme in ways[n]]

    # Phase B: no MPS.
    runs(each("exclusive"), None)

    # Phase C: MPS. gpushare with the chart's defaults and MPS without limits on every trace
    # (the makespan target's baseline), gpushare with the marked rows and with every batch row
    # opted in; then the latency experiment, then context runs while the budget lasts.
    daemon = safe(ctx.daemon, "starting MPS", ctx.errors) if not args.dry else None
    sampler = None if args.dry else Sampler(index=args.gpu, period_s=0.2)
    governing = (
        Governing(sampler.profile_last, GOVERNOR_PERIOD_S, GOVERNOR_WINDOW_S)
        if sampler is not None and sampler.available
        else None
    )
    try:
        order = ("gpushare", "mps_unlimited", OPPORTUNISTIC, OPPORTUNISTIC_ALL)
        runs([w for name in order for w in each(name)], daemon, governing)
        st.corrections = dict(opportunism.corrections.factors)
        if args.latency_rounds > 0:
            st.latency = (
                safe(lambda: measure_latency(ctx, st, decider, daemon), "latency", ctx.errors) or {}
            )
        checkpoint()
        runs(each("mps_equal"), daemon)
    finally:
        if sampler is not None:
            sampler.close()
        if daemon is not None:
            daemon.stop()
    runs(each("timeslice"), None)
    return checkpoint()


def measure_latency(
    ctx: Ctx, st: State, decider: ProductDecider, daemon: MpsDaemon | None
) -> dict[str, Any]:
    window, rounds, need = latency_plan(ctx.args)
    if ctx.left() < need:
        ctx.errors.append(f"latency: skipped, {ctx.left():.0f}s of budget left ({need:.0f}s)")
        return {}
    pool = Pool(ctx.workers(), ctx.pipe(daemon), {})
    try:
        return latency.measure(
            pool=pool,
            decider=decider,
            train_solo=st.solo.get("resnet50"),
            window_s=window,
            rounds=rounds,
            calibration_rounds=2,
        )
    finally:
        pool.close()


def assemble(*, ctx: Ctx, st: State) -> dict[str, Any]:
    traces_out: dict[str, dict[str, Any]] = {}
    scheme_details: dict[str, dict[str, Any]] = {}
    job_details: dict[str, dict[str, Any]] = {}
    for name, by_scheme in st.runs.items():
        ex = by_scheme.get("exclusive", [])
        solo_run = {j.id: j.run_s for j in ex if j.ok}
        traces_out[name], scheme_details[name], job_details[name] = {}, {}, {}
        for scheme in report.SCHEMES:
            if scheme not in by_scheme:
                continue
            s = summarize(by_scheme[scheme], solo_run_s=solo_run)
            traces_out[name][scheme] = {k: s[k] for k in report.TRACE_KEYS}
            scheme_details[name][scheme] = {
                k: v for k, v in s.items() if k not in report.TRACE_KEYS
            }
            job_details[name][scheme] = [j.to_json() for j in by_scheme[scheme]]
    shipped = st.model.get("shipped", {})
    loko = st.model.get("leave_one_kind_out", {})
    results: dict[str, Any] = {
        "gpu": ctx.gpu_name,
        "driver": ctx.driver,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "decided_by": {
            **DECIDED_BY,
            "model": model_identity(),
            "bounds": dict(DEFAULT_BOUNDS),
            "code_rev": ctx.args.code_rev or None,
        },
        "traces": traces_out,
        "latency": {
            k: st.latency.get(k)
            for k in (
                "solo_p99_ms",
                "solo_mps_p99_ms",
                "shared_p99_ms",
                "train_retained_ratio",
                "training_cap",
            )
        },
        "model": {
            "unseen_kinds_mape": shipped.get("unseen_kinds_mape"),
            "unseen_kinds_mape_calibrated": st.model.get("calibrated", {}).get("unseen_kinds_mape"),
            "fitted_kinds_mape": shipped.get("fitted_kinds_mape"),
            "leave_one_kind_out_mape": loko.get("mape"),
            "stored_runs_repeat_mape": st.model.get("repeatability", {}).get("mape"),
        },
        "packing_vs_exhaustive": _clean(st.exhaustive.get("packing_vs_exhaustive")),
    }
    results["details"] = {
        "quick": ctx.args.quick,
        "dry_run": ctx.args.dry,
        "budget_s": ctx.args.budget_s,
        "run_s": round(time.time() - ctx.t_start, 1),
        "machine": f"{os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}",
        "profile_source": st.profile_source,
        "trace_sources": {t.name: t.source for t in ctx.args.traces},
        "phase_a": ctx.phase_a_from,
        "requested_fractions": st.fractions,
        "limits": {
            n: {j.id: j.limit_percent for j in jobs if j.limit_percent is not None}
            for n, jobs in st.jobs.items()
        },
        "solo_rates_mps": {k: round(v, 3) for k, v in st.solo.items()},
        "profiles": st.profiles,
        "raw_profiles": st.raw_profiles,
        "trace_jobs": {n: len(j) for n, j in st.jobs.items()},
        "warm_plans": {n: plan.to_json() for n, plan in st.warm_plans.items()},
        "ways": st.ways,
        "memory_mib": st.memory,
        "startup_s": startup_by_kind(st),
        "iterations": st.iterations,
        "schemes": scheme_details,
        "jobs": job_details,
        "gpushare_holds": st.holds,
        "corrections": st.corrections,
        "latency": st.latency,
        "model": st.model,
        "exhaustive": st.exhaustive,
        "colocation_packs": len(st.recs),
        "errors": ctx.errors,
    }
    results["targets"] = report.check_targets(results)
    results["comparisons"] = [
        c for scheme in report.GPUSHARE for c in report.comparisons(results, scheme=scheme)
    ]
    results["by_trace"] = report.by_trace(results)
    return results


def startup_by_kind(st: State) -> dict[str, float]:
    """Mean process start-up (CUDA context, model, warm-up) per kind, paid before the clock."""
    seen: dict[str, list[float]] = {}
    for by_scheme in st.runs.values():
        for results in by_scheme.values():
            for j in results:
                if j.init_s is not None:
                    seen.setdefault(j.kind, []).append(j.init_s)
    return {k: round(sum(v) / len(v), 2) for k, v in seen.items()}


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):  # NaN is not JSON
        return None
    return round(value, 4) if isinstance(value, float) else value


def budget_needed(args: argparse.Namespace) -> float:
    """Seconds the runs every comparison needs (phase A, exclusive FIFO, MPS without limits and
    gpushare's three ways on every trace, the latency stage), as ``run_scheme`` and
    ``measure_latency`` estimate them; context runs not counted."""
    if args.phase == "colocations":
        return 0.0
    return phase_a_need_s(args) + _runs_needed(args)


def phase_a_need_s(args: argparse.Namespace) -> float:
    """Phase A's seconds: its share of the budget, or, resumed, the kinds the stored phase A
    lacks measured alone (``auto``: judged from the newest stored one)."""
    if args.resume is None:
        return PHASE_A_SHARE * float(args.budget_s)
    path = args.resume
    if str(path) == "auto":  # the GPU is not known yet: judged from the newest of any GPU
        path = stored_phase_a(None)
    try:
        known = set(json.loads(path.read_text())["solo"]) if path is not None else set()
    except (OSError, ValueError, KeyError):
        known = set()
    missing = {j.kind for t in args.traces for j in t.jobs} - known
    return STARTUP_S + SOLO_WINDOW_S * 1.2 * len(missing) if missing else 0.0


def scheme_need_s(scheme: str, work_s: float) -> float:
    """Seconds a trace of ``work_s`` solo seconds takes under ``scheme``, its processes' start
    and end included: run 25's H100 call took 569 s where these figures summed to 581 s."""
    return (1.1 if scheme == "exclusive" else 0.8) * work_s + STARTUP_S


def latency_plan(args: argparse.Namespace) -> tuple[float, int, float]:
    """The latency stage's window (s), rounds, and the seconds it needs (none at 0 rounds)."""
    window = 3.0 if args.quick else 4.0
    rounds = 3 if args.quick and args.latency_rounds else int(args.latency_rounds)
    return window, rounds, (window * (3 * rounds + 2) * 1.1 + 20) if rounds else 0.0


def run_plan(args: argparse.Namespace) -> list[tuple[str, str, float]]:
    """(trace, scheme, expected seconds) of every trace run, in the order they run; context
    runs last."""
    order = ["exclusive", "gpushare", "mps_unlimited", OPPORTUNISTIC, OPPORTUNISTIC_ALL, *CONTEXT]
    planned = {t.name: planned_schemes(t.name, t.jobs) for t in args.traces}
    return [
        (t.name, scheme, scheme_need_s(scheme, t.work_s))
        for scheme in order
        for t in args.traces
        if scheme in planned[t.name]
    ]


def _runs_needed(args: argparse.Namespace) -> float:
    runs = sum(s for _, scheme, s in run_plan(args) if scheme not in CONTEXT)
    return runs + latency_plan(args)[2]


def plan_text(args: argparse.Namespace) -> str:
    """What ``--plan`` prints: every run and its expected seconds, phase A, the latency stage,
    the total against the budget."""
    lines = [f"{'trace':<12} {'work_s':>6}  runs (expected s)"]
    for t in args.traces:
        cells = [f"{s} {need:.0f}" for name, s, need in run_plan(args) if name == t.name]
        lines.append(f"{t.name:<12} {t.work_s:6.1f}  " + ", ".join(cells))
    context = sum(need for _, s, need in run_plan(args) if s in CONTEXT)
    need = budget_needed(args)
    lines += [
        f"phase A: {phase_a_need_s(args):.0f} s; latency stage: {latency_plan(args)[2]:.0f} s",
        f"comparisons: {need:.0f} s ({need / 60:.1f} min) of a {args.budget_s:.0f}-s budget: "
        + ("fits" if need <= args.budget_s else "does NOT fit"),
        f"context runs (while the budget lasts): {context:.0f} s more",
    ]
    return "\n".join(lines)


def budget_for(args: argparse.Namespace) -> float:
    """The budget that holds the comparisons, phase A's share of it included."""
    # The colocation stage takes a share of the budget itself: solve for the budget that holds.
    share = 0.0 if args.resume is not None else PHASE_A_SHARE
    fixed = phase_a_need_s(args) if args.resume is not None else 0.0
    return float(math.ceil((_runs_needed(args) + fixed) / (1.0 - share) / 10) * 10)


def budget_warning(args: argparse.Namespace) -> str | None:
    """A warning, before any GPU work, when ``--budget-s`` cannot hold the comparisons."""
    need = budget_needed(args)
    if need <= args.budget_s:
        return None
    stage = "" if args.resume is not None else ", the colocation stage"
    suggest = budget_for(args)
    return (
        f"--budget-s {args.budget_s:.0f} is short: the comparisons need about {need:.0f} s "
        f"(exclusive FIFO, MPS without limits and gpushare three ways on every trace, the "
        f"latency stage{stage}); runs that do not fit are skipped and their targets read "
        f"'not measured'. Give --budget-s {suggest:.0f} or fewer traces (--traces), or split the "
        "run with --phase colocations and --resume"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plan:
        print(plan_text(args))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = [
        logging.StreamHandler(sys.stderr),
        logging.FileHandler(args.out / "run.log", mode="w"),
    ]
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", handlers=handlers
    )
    if args.dry:
        log.warning("DRY RUN: no GPU work is done; numbers only check the harness")
    short = budget_warning(args)
    if short:
        log.warning("%s", short)
    tmp = Path(tempfile.mkdtemp(prefix="gpushare-bench-"))
    ctx = Ctx(args=args, t_start=time.time(), tmp=tmp)
    try:
        results = run(ctx)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("wrote results into %s in %.0fs", args.out, time.time() - ctx.t_start)
    for c in results["targets"]:
        log.info("target %-55s %s (limit %s): %s", c["target"], c["value"], c["limit"], c["met"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
