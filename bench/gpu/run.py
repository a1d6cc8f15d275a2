"""Benchmark job mixes on one real GPU: gpushare vs exclusive FIFO, time-slicing and MPS without
limits (equal-split MPS as context); the interference model on packs it was not fit on.

    PYTHONPATH=. python3 -m bench.gpu.run --out DIR [--trace FILE ...] [--budget-s S]

Every gpushare decision (placement, thread cap, MPS priority, admission) comes from the product
with its shipped interference model (``decide.ProductDecider``); nothing is fit on the run's
own packs to decide. One invocation, within ``--budget-s``:

A. MPS on: each job kind alone (solo rate + profile from gpushare's profiler), packs at several
   thread caps, the kinds the model never saw beside the others, the packs gpushare forms.
B. MPS off: every trace under exclusive FIFO; the heavy trace under time-slicing.
C. MPS on: every trace under gpushare with the chart's defaults, again with the opt-in on the
   rows the trace marks ``opportunistic`` (``gpushare_opportunistic``: opportunistic placement,
   promotion, preemption and the governor on the GPU's counters), and under MPS without
   limits; inference beside training; then, while the budget lasts, the context runs
   (equal-split MPS, time-slicing).

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu import colocate, latency, model_eval, repeatability, report, sizing, traces
from bench.gpu.catalog import KINDS, SOLO_ONLY_KINDS, TRAINING_KINDS, UNSEEN_KINDS
from bench.gpu.colocate import Member, PackResult, Stage
from bench.gpu.decide import DECIDED_BY, DEFAULT_BOUNDS, ProductDecider, model_identity
from bench.gpu.gpm import Sampler, to_profile
from bench.gpu.metrics import JobResult, summarize
from bench.gpu.mps import MpsDaemon
from bench.gpu.procs import Workers
from bench.gpu.runner import Governing, Pool, measure_stages, run_trace, safe
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
OPPORTUNISTIC = "gpushare_opportunistic"
GOVERNOR_PERIOD_S = 0.5
GOVERNOR_WINDOW_S = 0.6
GOVERNOR_SETTLE_S = 1.0
"""The governor's timing here: the benchmark's jobs last 2-3 s, so it judges a tenant after
1 s on windows of 0.6 s every 0.5 s, where a controller (jobs of hours) waits 30 s on windows
of tens of seconds. The rule is the product's (``gpushare.packing.governor.review``)."""
STARTUP_S = 12.0
"""Seconds a trace run spends starting and warming up its processes, before its clock."""


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
        "memory]); repeat for several; default: the shipped light, heavy and mixed traces",
    )
    p.add_argument("--quick", action="store_true", help="shorter jobs, fewer packs (~4 min)")
    p.add_argument("--gpu", type=int, default=0, help="GPU index (default 0)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="wall-clock budget; packs are trimmed and context runs skipped to fit "
        "(default 700, quick 300; a lent GPU that runs a command at most 10 minutes takes "
        "the full run in two: --phase colocations, then --resume)",
    )
    p.add_argument("--slots", type=int, default=4, help="replicas of equal-split MPS (100/N%%)")
    p.add_argument(
        "--latency-rounds",
        type=int,
        default=6,
        help="rounds of the reported latency windows (a multiple of 3 balances the order)",
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
        help="phase A's phase-a.json from an earlier invocation on the same GPU: run the rest",
    )
    p.add_argument(
        "--dry",
        action="store_true",
        help="no GPU: workers sleep instead of computing; checks the harness, not a benchmark",
    )
    args = p.parse_args(argv)
    if args.slots < 1:
        p.error("--slots must be at least 1 (equal-split MPS needs one replica or more)")
    if args.latency_rounds < 1:
        p.error("--latency-rounds must be at least 1")
    if args.budget_s is None:
        args.budget_s = 300.0 if args.quick else 700.0
    if args.budget_s < 60:
        p.error("--budget-s below 60 s cannot fit a run; give 300 (quick) or 700 (full)")
    try:
        args.traces = traces.load_all(args.trace)
    except traces.TraceError as exc:
        p.error(str(exc))
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
    profiles = {k: pipe_profile(v, gpu_model=ctx.gpu_name) for k, v in st.profiles.items()}
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


def alone_peaks(st: State) -> dict[str, int]:
    """Each kind's peak GPU memory in bytes while it ran alone (exclusive FIFO, phase B): what
    the operator's profile of it would carry. NVML's figure for its process where it has one,
    else the allocator's peak plus :data:`CONTEXT_ALLOWANCE_MIB`; kinds not run alone yet have
    none (their pods get no peak, as a GpuShare not profiled yet)."""
    out: dict[str, int] = {}
    for by_scheme in st.runs.values():
        for job in by_scheme.get("exclusive", []):
            if not job.ok:
                continue
            if job.process_mib is not None:
                mib = job.process_mib
            elif job.peak_mib is not None:
                mib = job.peak_mib + CONTEXT_ALLOWANCE_MIB
            else:
                continue
            out[job.kind] = max(out.get(job.kind, 0), mib * (1 << 20))
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


def phase_a(ctx: Ctx, st: State) -> None:
    """Profiles, colocation packs (known and unseen kinds) and the packs gpushare forms."""
    quick = ctx.args.quick
    # The known kinds' short plan (the shipped model was fit on their full plans in earlier
    # runs), with the unseen kinds' packs before the capped stage so a tight budget trims that.
    stages = colocate.plan(TRAINING_KINDS, quick=True)
    extra_kinds = [
        k for k in (*SOLO_ONLY_KINDS, *UNSEEN_KINDS, *trace_kinds(ctx)) if k not in TRAINING_KINDS
    ]
    extra_solo = tuple((Member(k, 100),) for k in dict.fromkeys(extra_kinds))
    solo = stages[0]
    stages[0] = Stage(solo.name, (*solo.packs, *extra_solo), 1.5 if quick else 2.0)
    window = 0.8 if quick else 1.0
    stages = [Stage(st_.name, st_.packs, window) if i else st_ for i, st_ in enumerate(stages)]
    unseen = colocate.unseen_plan(UNSEEN_KINDS, TRAINING_KINDS, window=window)
    stages = [stages[0], stages[1], *unseen, *stages[2:]]
    workers = ctx.workers()
    daemon = ctx.daemon()
    sampler = None if ctx.args.dry else Sampler(index=ctx.args.gpu, period_s=0.2)
    st.profile_source = sampler.source if sampler else "none (dry run)"
    pool = Pool(workers, daemon.pipe_dir if daemon else None, {})
    share = 1.0 if ctx.args.phase == "colocations" else PHASE_A_SHARE
    budget_end = time.time() + share * ctx.args.budget_s - (60 if share == 1.0 else 0)

    def on_solo(m: Member, start: float, end: float, rate: float) -> None:
        st.solo[m.kind] = rate
        if sampler is not None:
            record_profile(st, m.kind, sampler.profile_last(max(0.3, end - start - 0.5)))
        else:
            st.profiles[m.kind] = to_profile(GpuProfile(sm_occupancy=0.2, fp32=0.2))

    try:
        # The solo stage first (every trace needs its kinds' rates), then the packs.
        st.results += measure_stages(
            pool=pool, stages=stages[:1], deadline=budget_end + 60, on_solo=on_solo
        )
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
    governing: Governing | None = None,
) -> list[JobResult] | None:
    """The jobs' results (also stored in ``st.runs``), or None when the budget left cannot fit
    the run or it failed."""
    jobs = st.jobs[trace]
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
    st.chosen = {
        tuple((str(k), int(t)) for k, t in key): tuple((str(k), int(t)) for k, t in pick)
        for key, pick in raw["chosen"]
    }


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
        load_state(st, args.resume)
        log.info("phase A from %s: %d packs", args.resume, len(st.results))
        unmeasured = size_and_choose(ctx, st)
        if unmeasured:
            log.warning(
                "resumed: %d of the packs and caps this code forms were not measured in %s; "
                "their scenarios read 'not measured' in the packs-vs-exhaustive comparison",
                len(unmeasured),
                args.resume,
            )
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
    checkpoint()
    if args.phase == "colocations":
        return checkpoint()
    names = [t.name for t in args.traces]
    heavy = [n for n in names if n == "heavy"]

    def runs(
        items: Sequence[tuple[Callable[[], Scheme], str]],
        daemon: MpsDaemon | None,
        governing: Governing | None = None,
    ) -> None:
        for make, trace in items:
            scheme = make()
            # The controller's governor reads every shared GPU: on the default runs it only
            # learns (no pod there opted in), and the opt-in runs start from what it learned.
            governed = governing if isinstance(scheme, Gpushare) else None
            run_scheme(ctx, scheme, trace, st, daemon, governing=governed)
            if isinstance(scheme, Gpushare):
                st.holds[f"{trace}/{scheme.name}" if scheme.name != "gpushare" else trace] = (
                    scheme.holds[:200]
                )
            checkpoint()

    # Phase B: no MPS.
    runs([(ExclusiveFifo, n) for n in names] + [(TimeSlice, n) for n in heavy], None)

    # Phase C: MPS. gpushare (the chart's defaults, then the trace's opt-in rows honoured) and
    # MPS without limits on every trace (the makespan target's baseline), then the latency
    # experiment, then context runs while the budget lasts.
    daemon = safe(ctx.daemon, "starting MPS", ctx.errors) if not args.dry else None
    # One set of corrections for the run, as one controller keeps learning across its GPUs.
    opportunism = Opportunism()
    opt_in = make_decider(ctx, st, opportunism=opportunism)
    learning = make_decider(ctx, st, opportunism=opportunism, honour_opt_in=False)
    sampler = None if args.dry else Sampler(index=args.gpu, period_s=0.2)
    governing = (
        Governing(sampler.profile_last, GOVERNOR_PERIOD_S, GOVERNOR_WINDOW_S)
        if sampler is not None and sampler.available
        else None
    )
    try:

        def gs(trace: str, *, opportunistic: bool = False) -> Callable[[], Scheme]:
            # A job can only start beside a latency pod in a trace that holds one: elsewhere
            # that variant's warm process would never run and only cost memory and an MPS client.
            with_service = any(j.gpu_class == CLASS_LATENCY for j in st.jobs.get(trace, []))
            chosen = opt_in if opportunistic else learning

            def make() -> Scheme:
                if not opportunistic:
                    return Gpushare(
                        chosen,
                        prepare=lambda job: chosen.variants(job, beside_latency=with_service),
                        source="gpushare (product)",
                        govern=lambda running, measured, now: chosen.review(
                            running, measured, now, settle_s=GOVERNOR_SETTLE_S
                        ),
                    )
                return Gpushare(
                    chosen,
                    prepare=lambda job: chosen.variants(job, beside_latency=with_service),
                    source="gpushare (product)",
                    name=OPPORTUNISTIC,
                    promote=chosen.promotions,
                    resume=chosen.resumptions,
                    priority=chosen.priority,
                    govern=lambda running, measured, now: chosen.review(
                        running, measured, now, settle_s=GOVERNOR_SETTLE_S
                    ),
                )

            return make

        marked = [n for n in names if any(j.opportunistic for j in st.jobs.get(n, []))]
        runs(
            [(gs(n), n) for n in names]
            + [(gs(n, opportunistic=True), n) for n in marked]
            + [(MpsUnlimited, n) for n in names],
            daemon,
            governing,
        )
        st.corrections = dict(opportunism.corrections.factors)
        st.latency = (
            safe(lambda: measure_latency(ctx, st, decider, daemon), "latency", ctx.errors) or {}
        )
        checkpoint()
        others = [n for n in names if n not in heavy]
        runs([(lambda: MpsEqual(args.slots), n) for n in others], daemon)
    finally:
        if sampler is not None:
            sampler.close()
        if daemon is not None:
            daemon.stop()
    runs([(TimeSlice, n) for n in names if n not in heavy], None)
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
        "phase_a": str(ctx.args.resume) if ctx.args.resume else "this invocation",
        "requested_fractions": st.fractions,
        "limits": {
            n: {j.id: j.limit_percent for j in jobs if j.limit_percent is not None}
            for n, jobs in st.jobs.items()
        },
        "solo_rates_mps": {k: round(v, 3) for k, v in st.solo.items()},
        "profiles": st.profiles,
        "raw_profiles": st.raw_profiles,
        "trace_jobs": {n: len(j) for n, j in st.jobs.items()},
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
    """Seconds the runs every comparison needs take at least (the colocation stage's share,
    exclusive FIFO and gpushare on every trace, the heavy trace's baselines, the latency
    stage), as ``run_scheme`` and ``measure_latency`` estimate them; context runs not counted."""
    if args.phase == "colocations":
        return 0.0
    share = 0.0 if args.resume is not None else PHASE_A_SHARE
    return share * float(args.budget_s) + _runs_needed(args)


def scheme_need_s(scheme: str, work_s: float) -> float:
    """Seconds a trace of ``work_s`` solo seconds needs under ``scheme``, at least."""
    return (1.1 if scheme == "exclusive" else 0.8) * work_s + STARTUP_S


def latency_plan(args: argparse.Namespace) -> tuple[float, int, float]:
    """The latency stage's window (s), rounds, and the seconds it needs."""
    window = 3.0 if args.quick else 4.0
    rounds = 3 if args.quick else int(args.latency_rounds)
    return window, rounds, window * (3 * rounds + 2) * 1.1 + 20


def _runs_needed(args: argparse.Namespace) -> float:
    need = 0.0
    for t in args.traces:
        # Exclusive FIFO, gpushare (and its opt-in run where the trace marks rows) and MPS
        # without limits on every trace; the heavy target's other baselines on it too.
        baselines = report.HEAVY_BASELINES if t.name == "heavy" else ("exclusive", "mps_unlimited")
        opt_in = [OPPORTUNISTIC] if any(j.opportunistic for j in t.jobs) else []
        schemes = ["gpushare", *opt_in, *baselines]
        need += sum(scheme_need_s(name, t.work_s) for name in schemes)
    return need + latency_plan(args)[2]


def budget_warning(args: argparse.Namespace) -> str | None:
    """A warning, before any GPU work, when ``--budget-s`` cannot hold the comparisons."""
    need = budget_needed(args)
    if need <= args.budget_s:
        return None
    stage = "" if args.resume is not None else ", the colocation stage"
    # The colocation stage takes a share of the budget itself: solve for the budget that holds.
    share = 0.0 if args.resume is not None else PHASE_A_SHARE
    suggest = math.ceil(_runs_needed(args) / (1.0 - share) / 10) * 10
    return (
        f"--budget-s {args.budget_s:.0f} is short: the comparisons need about {need:.0f} s "
        f"(exclusive FIFO, gpushare and MPS without limits on every trace, the latency "
        f"stage{stage}); runs that do "
        f"not fit are skipped and their targets read 'not measured'. Give --budget-s "
        f"{suggest} or fewer --trace files, or split the run with "
        "--phase colocations and --resume"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
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
