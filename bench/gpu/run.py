"""Benchmark job mixes on one real GPU: gpushare vs exclusive FIFO, time-slicing, equal-split
MPS and MPS without limits; colocation measurements for the interference model.

    PYTHONPATH=. python3 -m bench.gpu.run --out DIR [--quick]

One invocation does everything on one GPU in three phases, within ``--budget-s``:

A. MPS on: each job kind alone (solo rate + per-pipe profile from gpushare's profiler), then
   pairs and larger packs at several thread caps -> colocations.json; fit gpushare's
   interference model; measure the packs gpushare itself would form.
B. MPS off: both traces under exclusive FIFO and time-slicing; inference alone (solo p99).
C. MPS on: both traces under equal-split MPS, MPS without limits and gpushare; inference
   beside training.

Writes gpu-packing.json, gpu-packing.md, colocations.json and run.log into ``--out``.
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any

from bench.gpu import colocate, policy, report, traces
from bench.gpu.catalog import KINDS, SOLO_ONLY_KINDS, TRAINING_KINDS
from bench.gpu.colocate import Member, PackResult, Stage
from bench.gpu.gpm import Sampler, to_profile
from bench.gpu.metrics import JobResult, summarize
from bench.gpu.mps import MpsDaemon, priority_for
from bench.gpu.procs import Workers
from bench.gpu.runner import Pool, measure_stages, run_trace, safe
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
from bench.gpu.stats import percentile
from gpushare.packing.interference import InterferenceModel, load_default
from gpushare.packing.interference import fit as fit_model
from gpushare.packing.model import PipeProfile
from gpushare.packing.threads import assign_thread_percent, cap_beside_latency

log = logging.getLogger("bench.gpu")

LATENCY_LONG_S = 32.0
"""Time each setting the latency target compares gets -- inference alone under the same MPS
daemon and beside training at each measured training cap -- split into LATENCY_ROUNDS windows
interleaved with the other settings' (see ``shared_latency``): 32 s at 40 req/s is about 1280
requests, so a setting's p99 is its 13th-slowest request. Before run 10 each setting had one
24-s window in a row (the solo one twice, before and after), and a slow stretch of the host
landed in one setting: run 8's second solo window had a p99 of 20.4 ms against 8.0 ms in the
first."""
LATENCY_ROUNDS = 4
"""Rounds of the interleaved latency windows; each round runs every setting once, in an order
rotated from round to round, with that round's own arrival sequence."""
LATENCY_SHORT_S = 8.0
"""Window of the context rows (alone without MPS, beside training without caps or priorities)."""
NEIGHBOUR_CAPS = (50, 40)
"""Training thread caps measured beside the inference service; gpushare's cap for the job
(``assign_thread_percent``) is always one of them, and ``threads.cap_beside_latency`` picks
from the measured curve."""
TRAIN_FRACTION = 0.5
"""Share the training job asks for beside the inference service (DESIGN: training capped at
about half the GPU kept inference p99 near solo on an H200)."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.gpu.run",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="directory for results and logs")
    p.add_argument("--quick", action="store_true", help="shorter jobs, fewer packs (~4 min)")
    p.add_argument("--gpu", type=int, default=0, help="GPU index (default 0)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="wall-clock budget; colocation packs are trimmed to fit (default 585, quick 270)",
    )
    p.add_argument("--slots", type=int, default=4, help="replicas of equal-split MPS (100/N%%)")
    p.add_argument(
        "--latency-bound",
        type=float,
        default=policy.DEFAULT_BOUNDS["latency"],
        help="largest predicted slowdown gpushare accepts for latency-class jobs",
    )
    p.add_argument(
        "--batch-bound",
        type=float,
        default=policy.DEFAULT_BOUNDS["batch"],
        help="largest predicted slowdown gpushare accepts for batch jobs",
    )
    p.add_argument(
        "--dry",
        action="store_true",
        help="no GPU: workers sleep instead of computing; checks the harness, not a benchmark",
    )
    args = p.parse_args(argv)
    if args.slots < 1:
        p.error("--slots must be at least 1 (equal-split MPS needs one replica or more)")
    if args.budget_s is None:
        args.budget_s = 270.0 if args.quick else 585.0
    if args.budget_s < 60:
        p.error("--budget-s below 60 s cannot fit a run; give 270 (quick) or 585 (full)")
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
    torch: str | None = None

    def workers(self) -> Workers:
        device = "sleep" if self.args.dry else "cuda"
        return Workers(
            device=device,
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


# --- phase A ----------------------------------------------------------------------------


@dataclass
class PhaseA:
    results: list[PackResult] = field(default_factory=list)
    profiles: dict[str, dict[str, float]] = field(default_factory=dict)
    raw_profiles: dict[str, dict[str, float]] = field(default_factory=dict)
    solo: dict[str, float] = field(default_factory=dict)
    source: str = "unavailable"
    model: InterferenceModel | None = None
    model_source: str = ""
    pair_calibration: tuple[float, int] = (1.0, 0)
    """``policy.pair_calibration`` on this run's packs (factor, pairs counted)."""
    chosen: dict[colocate.PackKey, colocate.PackKey] = field(default_factory=dict)


def _members(key: colocate.PackKey) -> tuple[Member, ...]:
    seen: dict[tuple[str, int], int] = {}
    out = []
    for kind, tp in key:
        out.append(Member(kind, tp, seen.get((kind, tp), 0)))
        seen[(kind, tp)] = seen.get((kind, tp), 0) + 1
    return tuple(out)


def phase_a(ctx: Ctx, a: PhaseA, *, fractions: dict[str, float]) -> None:
    quick = ctx.args.quick
    stages = colocate.plan(TRAINING_KINDS, quick=quick)
    # Kinds profiled alone only (see catalog.SOLO_ONLY_KINDS).
    solo_stage = stages[0]
    extra_solo = tuple((Member(k, 100),) for k in SOLO_ONLY_KINDS)
    stages[0] = Stage(solo_stage.name, (*solo_stage.packs, *extra_solo), solo_stage.window_s)
    workers = ctx.workers()
    daemon = ctx.daemon()
    sampler = None if ctx.args.dry else Sampler(index=ctx.args.gpu, period_s=0.2)
    a.source = sampler.source if sampler else "none (dry run)"
    pool = Pool(workers, daemon.pipe_dir if daemon else None, {})
    budget_end = time.time() + 0.30 * ctx.args.budget_s

    def on_solo(m: Member, start: float, end: float, rate: float) -> None:
        a.solo[m.kind] = rate
        if sampler is not None:
            values = sampler.profile_last(max(0.3, end - start - 0.5))
            if values:
                a.raw_profiles[m.kind] = {k: round(v, 4) for k, v in values.items()}
            a.profiles[m.kind] = to_profile(values)
        else:
            a.profiles[m.kind] = to_profile({"sm_occupancy": 0.2, "fp32": 0.2})

    try:
        a.results += measure_stages(pool=pool, stages=stages, deadline=budget_end, on_solo=on_solo)
        fractions.update(
            {
                k: policy.request_fraction(
                    a.raw_profiles.get(k) or a.profiles.get(k), gpu_class=KINDS[k].gpu_class
                )
                for k in a.profiles
            }
        )
        log.info("requests sized from profiles: %s", fractions)
        recs = colocate.records(gpu=ctx.gpu_name, results=a.results, profiles=a.profiles)
        a.model, a.model_source = fit_or_default(recs, ctx)
        a.pair_calibration = policy.pair_calibration(a.model, recs, fractions=fractions)
        log.info("whole-GPU pairs: measured / predicted %.3f over %d", *a.pair_calibration)
        decider = make_decider(ctx, a)
        measured = {colocate.key_of(r) for r in recs}
        solo_caps = set(colocate.solo_table(a.results))
        extra: list[tuple[Member, ...]] = []
        for scen in colocate.scenarios(recs):
            kinds = [k for k, _ in scen]
            pick = policy.choose_pack(decider, kinds, fractions)
            a.chosen[scen] = pick
            for kind, tp in pick:
                if (kind, tp) not in solo_caps:
                    solo_caps.add((kind, tp))
                    extra.append((Member(kind, tp),))
            if len(pick) > 1 and pick not in measured:
                measured.add(pick)
                extra.append(_members(pick))
        log.info(
            "gpushare's packs for %d scenarios; %d packs to measure", len(a.chosen), len(extra)
        )
        if extra:
            window = stages[1].window_s
            choice_stage = Stage("gpushare-choices", tuple(extra), window)
            a.results += measure_stages(
                pool=pool, stages=[choice_stage], deadline=budget_end + 30, on_solo=on_solo
            )
    finally:
        pool.close()
        if sampler is not None:
            sampler.close()
        if daemon is not None:
            daemon.stop()


def _pipe(a: PhaseA, kind: str, ctx: Ctx) -> PipeProfile | None:
    values = a.profiles.get(kind)
    return policy.to_pipe_profile(values, gpu_model=ctx.gpu_name) if values else None


def fit_or_default(recs: list[colocate.Record], ctx: Ctx) -> tuple[InterferenceModel, str]:
    try:
        model = fit_model(policy.parse(recs), source=f"fit on this run's {len(recs)} packs")
        return model, model.source
    except Exception as exc:
        ctx.errors.append(f"fitting the interference model: {exc}; using the shipped default")
        return load_default(), "gpushare.packing default (shipped)"


def make_decider(ctx: Ctx, a: PhaseA) -> policy.GpushareDecider:
    profiles = {k: p for k in a.profiles if (p := _pipe(a, k, ctx)) is not None}
    return policy.GpushareDecider(
        profiles=profiles,
        model=a.model or load_default(),
        bounds={"latency": ctx.args.latency_bound, "batch": ctx.args.batch_bound},
        gpu_model=ctx.gpu_name,
        gpu_memory_bytes=ctx.memory_bytes,
        pair_calibration=a.pair_calibration[0],
    )


# --- traces -----------------------------------------------------------------------------


def run_scheme(
    ctx: Ctx,
    scheme: Scheme,
    jobs: list[traces.TraceJob],
    iterations: dict[str, int],
    daemon: MpsDaemon | None,
    *,
    label: str,
) -> list[JobResult] | None:
    """The jobs' results, or None when the budget left cannot fit the run or it failed;
    ``label`` names the run in errors (variants share the scheme's name)."""
    work = sum(j.work_s for j in jobs)
    timeout = max(60.0, 4 * work + 30)
    if ctx.left() < min(timeout, 2 * work + 20):
        ctx.errors.append(f"{label}: skipped, {ctx.left():.0f}s of budget left")
        return None
    log.info("== %s: %s", scheme.name, scheme.description)
    pipe = daemon.pipe_dir if daemon else None
    if ctx.args.dry and scheme.mps:
        pipe = ctx.tmp / "no-mps"
    result: list[JobResult] | None = safe(
        lambda: run_trace(
            scheme=scheme,
            jobs=jobs,
            iterations=iterations,
            workers=ctx.workers(),
            pipe_dir=pipe,
            timeout_s=timeout,
        ),
        f"trace under {label}",
        ctx.errors,
    )
    return result


# --- latency ----------------------------------------------------------------------------


def latency_window(pool: Pool, members: list[Member], seconds: float) -> list[dict[str, Any]]:
    return pool.window(members, seconds=seconds, seed=7)


def _lat_row(
    setting: str, rep: dict[str, Any], train: dict[str, Any] | None, solo: float | None
) -> dict[str, Any]:
    lat = rep.get("latencies_ms", [])
    row: dict[str, Any] = {"setting": setting, "requests": len(lat)}
    if lat:
        row["p50_ms"] = round(percentile(lat, 50), 3)
        row["p99_ms"] = round(percentile(lat, 99), 3)
    if train is not None:
        row["train_rate"] = round(float(train["rate"]), 3)
        if solo:
            row["train_share"] = round(float(train["rate"]) / solo, 3)
    return row


# --- main -------------------------------------------------------------------------------


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


@dataclass
class State:
    """Everything measured so far; assembled into the results at every checkpoint."""

    a: PhaseA = field(default_factory=PhaseA)
    recs: list[colocate.Record] = field(default_factory=list)
    runs: dict[str, dict[str, list[JobResult]]] = field(default_factory=dict)
    jobs: dict[str, list[traces.TraceJob]] = field(default_factory=dict)
    iterations: dict[str, dict[str, int]] = field(default_factory=dict)
    latency: dict[str, Any] = field(default_factory=dict)
    lat_rows: list[dict[str, Any]] = field(default_factory=list)
    holds: list[str] = field(default_factory=list)
    fractions: dict[str, float] = field(default_factory=dict)
    mape: dict[str, Any] = field(default_factory=dict)
    exhaustive: dict[str, Any] = field(default_factory=dict)
    variants: dict[str, list[JobResult]] = field(default_factory=dict)
    """Runs of gpushare under other settings (request sizing, no tail pairing)."""
    variant_traces: dict[str, str] = field(default_factory=dict)
    dense_fractions: dict[str, float] = field(default_factory=dict)


def run(ctx: Ctx) -> dict[str, Any]:
    args = ctx.args
    gpu_info(ctx)
    log.info("GPU %s, driver %s, budget %.0fs", ctx.gpu_name, ctx.driver, args.budget_s)
    scale = 0.4 if args.quick else 1.0
    st = State()
    a = st.a

    def checkpoint() -> dict[str, Any]:
        """Write what we have: a run cut short still leaves its results behind."""
        results = assemble(ctx=ctx, st=st)
        report.write(args.out, results)
        return results

    safe(
        lambda: phase_a(ctx, a, fractions=st.fractions),
        "phase A (profiles, colocations)",
        ctx.errors,
    )
    st.recs = colocate.records(gpu=ctx.gpu_name, results=a.results, profiles=a.profiles)
    (args.out / "colocations.json").write_text(
        json.dumps(colocate.validate(st.recs), indent=1) + "\n"
    )
    evaluate_model(ctx, st)
    for k in KINDS:
        st.fractions.setdefault(k, 1.0)
    trace_jobs = {
        "light": traces.with_requests(traces.light(scale), st.fractions),
        "heavy": traces.with_requests(traces.heavy(scale), st.fractions),
    }
    for name, jobs in trace_jobs.items():
        st.iterations[name] = {}
        st.runs[name] = {}
        for j in jobs:
            try:
                st.iterations[name][j.id] = traces.iterations_for(
                    j, solo_rate=a.solo.get(j.kind, 0.0)
                )
            except ValueError as exc:
                ctx.errors.append(str(exc))
        st.jobs[name] = [j for j in jobs if j.id in st.iterations[name]]
    decider = make_decider(ctx, a)
    lat_s = (4.0, 12.0) if args.quick else (LATENCY_SHORT_S, LATENCY_LONG_S)
    checkpoint()

    def trace(name: str, scheme: Scheme, daemon: MpsDaemon | None) -> None:
        r = run_scheme(
            ctx, scheme, st.jobs[name], st.iterations[name], daemon, label=f"{scheme.name}, {name}"
        )
        if r:
            st.runs[name][scheme.name] = r
        checkpoint()

    # Phase B: no MPS.
    for name in st.jobs:
        trace(name, ExclusiveFifo(), None)
        trace(name, TimeSlice(), None)
    solo_lat = safe(lambda: solo_latency(ctx, lat_s[0]), "inference alone", ctx.errors)
    if solo_lat:
        st.lat_rows.append(solo_lat)
        st.latency["no_mps_solo_p99_ms"] = solo_lat.get("p99_ms")

    # Phase C: MPS. gpushare first, then the baselines its targets compare with (MPS without
    # limits on both traces, equal-split on the light one), then the own-cap light-trace
    # variant, then the latency experiment, then the heavy trace without tail pairing; a short
    # budget cuts that, the equal-split heavy run and the dense sensitivity run, nothing a
    # target needs.
    daemon = safe(ctx.daemon, "starting MPS", ctx.errors) if not args.dry else None
    try:
        gs = Gpushare(
            decider,
            prepare=decider.prepare,
            source=f"gpushare.packing (model: {a.model_source})",
            tail=decider.tail_pair,
        )
        st.holds = gs.holds
        for name in st.jobs:
            trace(name, gs, daemon)
        for name in st.jobs:
            trace(name, MpsUnlimited(), daemon)
        if "light" in st.jobs:
            trace("light", MpsEqual(args.slots), daemon)
        # Sensitivity (before the latency rows, so a tight budget cannot skip it): the light
        # trace with admission bounding the slowdown vs the job alone at its own cap, i.e.
        # without the thread cap's cost charged (gpushare to run 8; runs 6-8 measured the
        # charged rule as this variant); same requests and caps as gpushare.
        if "light" in st.jobs:
            own_cap = policy.GpushareDecider(
                profiles=decider.profiles,
                model=decider.model,
                bounds=decider.bounds,
                gpu_model=decider.gpu_model,
                gpu_memory_bytes=decider.gpu_memory_bytes,
                pair_calibration=decider.pair_calibration,
                charge_cap=False,
            )
            r = run_scheme(
                ctx,
                Gpushare(
                    own_cap,
                    prepare=own_cap.prepare,
                    source="gpushare.packing, bound vs the job alone at its own cap",
                    tail=own_cap.tail_pair,
                ),
                st.jobs["light"],
                st.iterations["light"],
                daemon,
                label="gpushare_own_cap, light",
            )
            if r:
                st.variants["gpushare_own_cap"] = r
                st.variant_traces["gpushare_own_cap"] = "light"
            checkpoint()
        shared = safe(
            lambda: shared_latency(ctx, daemon, decider, a.solo.get("resnet50"), lat_s),
            "inference beside training",
            ctx.errors,
        )
        if shared:
            st.lat_rows += shared["rows"]
            st.latency.update(shared["latency"])
        checkpoint()
        # Sensitivity: the heavy trace without tail pairing (gpushare before run 5), same run.
        if "heavy" in st.jobs:
            r = run_scheme(
                ctx,
                Gpushare(decider, prepare=decider.prepare, source="gpushare.packing, no tail"),
                st.jobs["heavy"],
                st.iterations["heavy"],
                daemon,
                label="gpushare_no_tail, heavy",
            )
            if r:
                st.variants["gpushare_no_tail"] = r
                st.variant_traces["gpushare_no_tail"] = "heavy"
            checkpoint()
        for name in st.jobs:
            if name != "light":
                trace(name, MpsEqual(args.slots), daemon)
        # Sensitivity, last (skipped first when time is short): the light trace with requests
        # sized by the policy's own compute demand (denser packing, lower thread caps).
        dense = {
            k: policy.dense_fraction(_pipe(a, k, ctx), gpu_class=KINDS[k].gpu_class)
            for k in st.fractions
        }
        st.dense_fractions = dense
        dense_jobs = traces.with_requests(
            [j for j in traces.light(scale) if j.id in st.iterations["light"]], dense
        )
        r = run_scheme(
            ctx,
            Gpushare(decider, prepare=decider.prepare, source="gpushare.packing, dense requests"),
            dense_jobs,
            st.iterations["light"],
            daemon,
            label="gpushare_dense, light",
        )
        if r:
            st.variants["gpushare_dense"] = r
            st.variant_traces["gpushare_dense"] = "light"
    finally:
        if daemon is not None:
            daemon.stop()
    return checkpoint()


def evaluate_model(ctx: Ctx, st: State) -> None:
    """Held-out MAPE of gpushare's interference model and its packs vs exhaustive search."""
    if len(st.recs) >= 4:
        st.mape = (
            safe(
                lambda: colocate.held_out_mape(st.recs, fit=policy.fitter("k-fold"), k=5),
                "held-out MAPE",
                ctx.errors,
            )
            or {}
        )
    if st.a.chosen:
        st.exhaustive = (
            safe(
                lambda: colocate.exhaustive_comparison(
                    st.recs,
                    chosen=st.a.chosen,
                    solo=colocate.solo_table(st.a.results),
                    fractions=st.fractions,
                ),
                "exhaustive comparison",
                ctx.errors,
            )
            or {}
        )


def solo_latency(ctx: Ctx, seconds: float) -> dict[str, Any]:
    pool = Pool(ctx.workers(), None, {})
    try:
        m = Member("infer", 100)
        pool.ensure({m}, priority=lambda _: None)
        rep = latency_window(pool, [m], seconds)[0]
        return _lat_row("inference alone, no MPS", rep, None, None)
    finally:
        pool.close()


def shared_latency(
    ctx: Ctx,
    daemon: MpsDaemon | None,
    decider: policy.GpushareDecider,
    train_solo: float | None,
    seconds: tuple[float, float],
) -> dict[str, Any]:
    """Inference (latency class) beside ResNet-50 training under one MPS daemon.

    ``seconds`` = (short, long). The settings the target compares -- the service alone under
    this daemon, and with gpushare's settings (inference uncapped at priority 0, training at
    priority 1) beside training at each cap of NEIGHBOUR_CAPS plus gpushare's own -- each get
    ``long`` seconds in LATENCY_ROUNDS windows, interleaved: every round runs each setting once
    with the same arrivals, in an order rotated by one each round, so a slow stretch of the GPU
    or host falls on every setting alike rather than on whichever ran then.
    ``threads.cap_beside_latency`` picks the cap from the curve of pooled p99s and its row is
    the one the targets read. Plain MPS (no caps, no priorities) is a short context row."""
    short, long = seconds
    infer = traces.TraceJob("lat-infer", "infer", 0.0, 0.0, policy.LATENCY_FRACTION)
    train = traces.TraceJob("lat-train", "resnet50", 0.0, 0.0, TRAIN_FRACTION)
    first = decider(infer, [])
    assert isinstance(first, Launch), first
    running = [Running(infer, first)]
    verdict = decider(train, running)
    if isinstance(verdict, Launch):
        own_cap, note = verdict.thread_percent or 100, "admitted"
    else:
        own_cap = assign_thread_percent(decider.demand(train), decider.gpu(running))
        note = f"admission would refuse ({verdict}); run anyway to measure protection"
    infer_threads = first.thread_percent or 100
    caps = sorted({own_cap, *NEIGHBOUR_CAPS}, reverse=True)
    plain_i, plain_t = Member("infer", 100, 0), Member("resnet50", 100, 0)
    gs_i = Member("infer", infer_threads, 1)
    trainers = {cap: Member("resnet50", cap, 1) for cap in caps}
    prio: dict[Member, int | None] = {gs_i: priority_for("latency")}
    prio.update({m: priority_for("batch") for m in trainers.values()})
    pool = Pool(ctx.workers(), daemon.pipe_dir if daemon else ctx.tmp / "no-mps", {})
    settings: list[int | None] = [None, *caps]  # None: the service alone
    got: dict[int | None, list[list[dict[str, Any]]]] = {k: [] for k in settings}
    order: list[str] = []
    try:
        pool.ensure({plain_i, plain_t, gs_i, *trainers.values()}, priority=prio.get)
        both = latency_window(pool, [plain_i, plain_t], short)
        window = long / LATENCY_ROUNDS
        for r in range(LATENCY_ROUNDS):
            shift = r % len(settings)
            for setting in settings[shift:] + settings[:shift]:
                members = [gs_i] if setting is None else [gs_i, trainers[setting]]
                got[setting].append(pool.window(members, seconds=window, seed=7 + r))
                order.append("solo" if setting is None else f"{setting}%")
    finally:
        pool.close()
    solo_row = _pooled_row("inference alone, MPS (solo)", got[None], train_solo)
    rows = [
        solo_row,
        _lat_row("beside training, MPS no caps/priorities", both[0], both[1], train_solo),
    ]
    curve: dict[int, dict[str, Any]] = {}
    for cap in caps:
        own = " (assign_thread_percent's cap)" if cap == own_cap else ""
        curve[cap] = _pooled_row(
            f"beside training, inference {infer_threads}% prio 0, training {cap}% prio 1{own}",
            got[cap],
            train_solo,
        )
        rows.append(curve[cap])
    solo = solo_row.get("p99_ms")
    ratios = {cap: row["p99_ms"] / solo for cap, row in curve.items() if solo and row.get("p99_ms")}
    pick = cap_beside_latency(ratios, bound=ctx.args.latency_bound) if ratios else own_cap
    picked = curve.get(pick, {})
    if picked:
        picked["setting"] += " <- picked"
    return {
        "rows": rows,
        "latency": {
            "solo_p99_ms": solo,
            "solo_p99_ms_by_window": solo_row.get("p99_ms_by_window", []),
            "solo_requests": solo_row.get("requests", 0),
            "shared_p99_ms": picked.get("p99_ms"),
            "train_retained_ratio": picked.get("train_share"),
            "picked_training_cap": pick,
            "assign_thread_percent_cap": own_cap,
            "p99_ratio_by_training_cap": {str(c): round(r, 3) for c, r in ratios.items()},
            "p99_ms_by_window_by_training_cap": {
                str(c): row.get("p99_ms_by_window", []) for c, row in curve.items()
            },
            "window_s": round(long / LATENCY_ROUNDS, 2),
            "window_order": order,
            "uncapped_shared_p99_ms": rows[1].get("p99_ms"),
            "gpushare_admission": note,
        },
    }


def _pooled_row(
    setting: str, windows: list[list[dict[str, Any]]], train_solo: float | None
) -> dict[str, Any]:
    """One setting's latency row over its interleaved windows: percentiles of every request
    pooled, each window's own p99, training's rate averaged over the windows."""
    service = {"latencies_ms": [x for w in windows for x in w[0].get("latencies_ms", [])]}
    trains = [w[1] for w in windows if len(w) > 1]
    train = {"rate": mean([float(t["rate"]) for t in trains])} if trains else None
    row = _lat_row(setting, service, train, train_solo)
    row["p99_ms_by_window"] = [
        round(percentile(lat, 99), 3) if (lat := w[0].get("latencies_ms")) else None
        for w in windows
    ]
    return row


def assemble(*, ctx: Ctx, st: State) -> dict[str, Any]:
    a = st.a
    traces_out: dict[str, dict[str, Any]] = {}
    scheme_details: dict[str, dict[str, Any]] = {}
    job_details: dict[str, dict[str, Any]] = {}
    for name, by_scheme in st.runs.items():
        ex = by_scheme.get("exclusive", [])
        solo_run = {j.id: j.run_s for j in ex if j.ok}
        traces_out[name] = {}
        scheme_details[name] = {}
        job_details[name] = {}
        for scheme in report.SCHEMES:
            if scheme not in by_scheme:
                continue
            s = summarize(by_scheme[scheme], solo_run_s=solo_run)
            traces_out[name][scheme] = {k: s[k] for k in report.TRACE_KEYS}
            scheme_details[name][scheme] = {
                k: v for k, v in s.items() if k not in report.TRACE_KEYS
            }
            job_details[name][scheme] = [j.to_json() for j in by_scheme[scheme]]
    results: dict[str, Any] = {
        "gpu": ctx.gpu_name,
        "driver": ctx.driver,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "traces": traces_out,
        "latency": {
            "solo_p99_ms": st.latency.get("solo_p99_ms"),
            "shared_p99_ms": st.latency.get("shared_p99_ms"),
            "train_retained_ratio": st.latency.get("train_retained_ratio"),
        },
        "prediction_mape": _clean(st.mape.get("mape_slowdown")),
        "packing_vs_exhaustive": _clean(st.exhaustive.get("packing_vs_exhaustive")),
    }
    results["details"] = {
        "quick": ctx.args.quick,
        "dry_run": ctx.args.dry,
        "run_s": round(time.time() - ctx.t_start, 1),
        "machine": f"{os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}",
        "profile_source": a.source,
        "policy_source": f"gpushare.packing (fit_reason, admit_reason bounds "
        f"latency {ctx.args.latency_bound} / batch {ctx.args.batch_bound} vs the whole GPU, "
        f"assign_thread_percent); model: {a.model_source}",
        "model": a.model.to_dict() if a.model else None,
        "pair_calibration": {"factor": a.pair_calibration[0], "pairs": a.pair_calibration[1]},
        "mps_equal_slots": ctx.args.slots,
        "requested_fractions": st.fractions,
        "solo_rates_mps": {k: round(v, 3) for k, v in a.solo.items()},
        "profiles": a.profiles,
        "raw_profiles": a.raw_profiles,
        "trace_jobs": {n: len(j) for n, j in st.jobs.items()},
        "startup_s": startup_by_kind(st),
        "variants": variant_summaries(st),
        "iterations": st.iterations,
        "schemes": scheme_details,
        "jobs": job_details,
        "gpushare_holds": st.holds[:200],
        "latency": st.latency,
        "latency_rows": st.lat_rows,
        "mape": {k: _clean(v) for k, v in st.mape.items()},
        "exhaustive": st.exhaustive,
        "colocation_packs": len(st.recs),
        "errors": ctx.errors,
    }
    results["targets"] = report.check_targets(results)
    return results


def variant_summaries(st: State) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, results in st.variants.items():
        trace = st.variant_traces.get(name, "light")
        ex = st.runs.get(trace, {}).get("exclusive", [])
        solo_run = {j.id: j.run_s for j in ex if j.ok}
        out[name] = {
            "trace": trace,
            **summarize(results, solo_run_s=solo_run),
            "jobs": [j.to_json() for j in results],
        }
        if name == "gpushare_dense":
            out[name]["requested_fractions"] = st.dense_fractions
    return out


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


if __name__ == "__main__":
    sys.exit(main())
