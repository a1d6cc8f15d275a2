"""Replay a trace under gpushare's decisions with the interference model as the GPU: an offline
estimate (no GPU) for choosing what a full run should measure, never a result of record.

    PYTHONPATH=. python3 -m bench.gpu.replay --results bench/results/gpu-packing.json \\
        --colocations bench/gpu/data/colocations.json [--trace light] [--own-cap] [--no-tail]

Each running job advances at 1 / (the model's same-cap slowdown x the cost of its thread cap
alone: measured at 100/50/25%, the model's cap cost at any other cap); the inference service
runs for its measured duration. Profiles, requests and solo rates at each cap come from a run's
results and colocations; the model is fit on the colocations. Admission bounds a batch job's
slowdown vs the whole GPU (the cap's modelled cost charged, up to sqrt(bound): gpushare's
default since run 9); ``--own-cap`` replays the bound vs the job alone at its own cap (gpushare
to run 8); ``--half-heavy`` lets the transformer and ResNet-50 ask for half a GPU;
``--measured-solo`` gives each job its run time under ``exclusive`` as its solo work (default:
the trace's nominal ``work_s``, 2.5 s for most, which overstates the run's 23.9 s of batch work
by 0.6 s); ``--saturating-first`` starts a pipe-saturating whole-GPU job (the FP64 GEMM) before
the other whole-GPU jobs waiting, so the last two can form a tail pair.
"""

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.gpu import colocate, policy, traces
from bench.gpu.schemes import Gpushare, Running
from gpushare.api.names import CLASS_LATENCY
from gpushare.packing import interference
from gpushare.packing.interference import InterferenceModel, fit, parse_records
from gpushare.packing.threads import pipe_saturating

STEP_S = 0.01


def replay(
    *,
    results: dict[str, Any],
    records: list[colocate.Record],
    trace: str,
    fractions: dict[str, float],
    model: InterferenceModel,
    charge_cap: bool = True,
    tail: bool = True,
    measured_solo: bool = False,
    saturating_first: bool = False,
) -> dict[str, float]:
    """(makespan, mean JCT, slowest run time / solo work) of ``trace`` under gpushare, jobs
    advancing at the rates ``model`` predicts; ``charge_cap``: admission bounds the slowdown vs
    the whole GPU (False: vs the job alone at its cap); ``tail``: the last waiting job may
    pair with a lone one (``GpushareDecider.tail_pair``); ``measured_solo``: a job's work is its
    run time under ``exclusive`` in the same run; ``saturating_first``: pipe-saturating
    whole-GPU jobs go before the other whole-GPU jobs in the queue (small jobs keep their
    places)."""
    d = results["details"]
    gpu = str(results.get("gpu", ""))
    profiles = {k: policy.to_pipe_profile(v, gpu_model=gpu) for k, v in d["profiles"].items()}
    full, at_cap = colocate.tables(records)
    decider = policy.GpushareDecider(
        profiles=profiles,
        model=model,
        bounds=dict(policy.DEFAULT_BOUNDS),
        gpu_model=gpu,
        gpu_memory_bytes=141 * 2**30,
        pair_calibration=policy.pair_calibration(model, records, fractions=fractions)[0]
        if tail
        else 1.0,
        charge_cap=charge_cap,
    )
    scheme = Gpushare(
        decider, prepare=decider.prepare, source="replay", tail=decider.tail_pair if tail else None
    )
    jobs = traces.with_requests(traces.TRACES[trace](), fractions)
    solo = {j["id"]: j["end_s"] - j["start_s"] for j in d["jobs"][trace]["exclusive"]}
    service = {j["id"] for j in d["jobs"][trace]["exclusive"] if j["kind"] == "infer"}
    work = {j.id: solo[j.id] if (measured_solo or j.id in service) else j.work_s for j in jobs}
    left = dict(work)
    arrivals = sorted(jobs, key=lambda j: j.arrival_s)
    pending: list[traces.TraceJob] = []
    running: dict[str, Running] = {}
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    t = 0.0
    while arrivals or pending or running:
        while arrivals and arrivals[0].arrival_s <= t + 1e-9:
            pending.append(arrivals.pop(0))
        queue = _saturating_first(decider, pending) if saturating_first else list(pending)
        for launch in scheme.select(queue, list(running.values())):
            pending.remove(launch.job)
            running[launch.job.id] = Running(launch.job, launch, t)
            start[launch.job.id] = t
        tenants = decider.gpu(list(running.values())).tenants
        for i, (r, tenant) in enumerate(zip(running.values(), tenants, strict=True)):
            if r.job.gpu_class == CLASS_LATENCY or tenant.profile is None:
                left[r.job.id] -= STEP_S
                continue
            others = [
                (
                    o.profile or interference.CONSERVATIVE_PROFILE,
                    o.percent if o.gpu_class == CLASS_LATENCY else interference.tenant_threads(o),
                )
                for k, o in enumerate(tenants)
                if k != i
            ]
            threads = interference.tenant_threads(tenant)
            alone = full.get(r.job.kind, 1.0)
            measured = at_cap.get((r.job.kind, threads))
            cap_cost = (
                alone / measured
                if measured is not None
                else model.cap_slowdown(tenant.profile, threads)
            )
            slowdown = model.predict(tenant.profile, threads, others) * cap_cost
            left[r.job.id] -= STEP_S / slowdown
        t += STEP_S
        for jid in [k for k in running if left[k] <= 0]:
            end[jid] = t
            del running[jid]
    return {
        "makespan_s": round(max(end.values()), 2),
        "mean_jct_s": round(sum(end[j.id] - j.arrival_s for j in jobs) / len(jobs), 2),
        "slowest": round(
            max((end[j.id] - start[j.id]) / work[j.id] for j in jobs if j.id not in service), 2
        ),
    }


def _saturating_first(
    decider: policy.GpushareDecider, pending: Sequence[traces.TraceJob]
) -> list[traces.TraceJob]:
    """``pending`` with its whole-GPU jobs reordered among their own places: pipe-saturating
    ones first (they can never tail-pair), the others after them in queue order."""

    def whole(j: traces.TraceJob) -> bool:
        return decider.demand(j).percent >= 100

    def saturating(j: traces.TraceJob) -> bool:
        profile = decider.demand(j).profile
        return profile is not None and pipe_saturating(profile)

    wholes = iter(sorted((j for j in pending if whole(j)), key=lambda j: not saturating(j)))
    return [next(wholes) if whole(j) else j for j in pending]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.gpu.replay",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--results", type=Path, required=True, help="a run's gpu-packing.json")
    p.add_argument("--colocations", type=Path, required=True, help="colocations.json")
    p.add_argument("--trace", choices=sorted(traces.TRACES), default="light")
    p.add_argument("--own-cap", action="store_true", help="bound vs alone at own cap (to run 8)")
    p.add_argument("--half-heavy", action="store_true", help="transformer, resnet50 ask 0.5")
    p.add_argument("--no-tail", action="store_true", help="no tail pairing (gpushare to run 4)")
    p.add_argument("--measured-solo", action="store_true", help="work = run time under exclusive")
    p.add_argument(
        "--saturating-first", action="store_true", help="GEMM before other whole-GPU jobs"
    )
    args = p.parse_args(argv)
    results = json.loads(args.results.read_text())
    records = colocate.validate(json.loads(args.colocations.read_text()))
    model = fit(parse_records(records), source="replay")
    fractions = dict(results["details"]["requested_fractions"])
    if args.half_heavy:
        fractions.update(transformer=0.5, resnet50=0.5)
    out = replay(
        results=results,
        records=records,
        trace=args.trace,
        fractions=fractions,
        model=model,
        charge_cap=not args.own_cap,
        tail=not args.no_tail,
        measured_solo=args.measured_solo,
        saturating_first=args.saturating_first,
    )
    flags = {
        "charge_cap": not args.own_cap,
        "half_heavy": args.half_heavy,
        "tail": not args.no_tail,
        "measured_solo": args.measured_solo,
        "saturating_first": args.saturating_first,
    }
    print(json.dumps({"trace": args.trace, **flags, **out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
