"""Inference (latency class) beside ResNet-50 training, with the settings gpushare decides.

The service's settings and the training job's come from the product (``decide.ProductDecider``:
the service admitted first on the idle GPU, then the training job beside it: its cap is what
``assign_thread_percent`` gives a batch pod placed beside a latency pod, its priority 1, the
service's 0). Nothing is picked from these measurements.

Method (docs/benchmarks-gpu.md, "Inference beside training"):

- every window starts with a warm-up the service's counted requests leave out: requests until
  the median of a block of 20 is within 10% of the previous block's (``worker.settled_after``);
- the reported settings -- the service alone without MPS (its own process outside the daemon),
  alone under MPS, and beside training as gpushare places it -- run in ``rounds`` rounds, each
  round every setting once in an order rotated by one, so each setting runs first, second and
  third equally often; each round has its own arrival sequence, the same for every setting;
- a context row (training uncapped at priority 1: a batch pod placed *before* the service,
  under gpushare's default limit) runs in its own windows before them, never pooled with the
  reported ones; with ``rotate_uncapped`` it is a fourth reported setting instead, rotated with
  the others (``bench.gpu.latency_ab``: does the cap on a latency pod's neighbour buy latency
  that MPS priority alone does not?).

A setting's p99 is over its pooled counted requests; each window's p99 is kept.
"""

from collections.abc import Sequence
from statistics import mean
from typing import Any

from bench.gpu.colocate import Member
from bench.gpu.decide import ProductDecider
from bench.gpu.runner import Pool
from bench.gpu.schemes import Launch, Running
from bench.gpu.stats import percentile
from bench.gpu.traces import TraceJob
from gpushare.api.names import MPS_PRIORITY_BY_CLASS

TRAIN_FRACTION = 0.5
"""Share the training job asks for beside the inference service (DESIGN: training capped at
about half the GPU kept inference p99 near solo on an H200)."""
SERVICE_FRACTION = 0.25

SOLO_NO_MPS = "inference alone, no MPS"
SOLO_MPS = "inference alone, MPS"
SHARED = "beside training, gpushare's settings"
UNCAPPED = "beside training uncapped at priority 1 (placed before the service)"


def _row(
    setting: str, windows: list[list[dict[str, Any]]], train_solo: float | None
) -> dict[str, Any]:
    lat = [x for w in windows for x in w[0].get("latencies_ms", [])]
    row: dict[str, Any] = {"setting": setting, "requests": len(lat), "windows": len(windows)}
    if lat:
        row["p50_ms"] = round(percentile(lat, 50), 3)
        row["p99_ms"] = round(percentile(lat, 99), 3)
    row["p99_ms_by_window"] = [
        round(percentile(w[0]["latencies_ms"], 99), 3) if w[0].get("latencies_ms") else None
        for w in windows
    ]
    row["warmup_requests_by_window"] = [int(w[0].get("warmup_requests", 0)) for w in windows]
    trains = [float(w[1]["rate"]) for w in windows if len(w) > 1]
    if trains:
        row["train_rate"] = round(mean(trains), 3)
        if train_solo:
            row["train_share"] = round(mean(trains) / train_solo, 3)
    return row


def rotations(settings: Sequence[str], rounds: int) -> list[list[str]]:
    """Round r runs the settings rotated by r: over a multiple of len(settings) rounds each
    setting takes each place equally often."""
    n = len(settings)
    return [list(settings[r % n :]) + list(settings[: r % n]) for r in range(rounds)]


def measure(
    *,
    pool: Pool,
    decider: ProductDecider,
    train_solo: float | None,
    window_s: float,
    rounds: int,
    calibration_rounds: int,
    rotate_uncapped: bool = False,
) -> dict[str, Any]:
    service = TraceJob("lat-infer", "infer", 0.0, 0.0, SERVICE_FRACTION, fixed_request=True)
    train = TraceJob("lat-train", "resnet50", 0.0, 0.0, TRAIN_FRACTION, fixed_request=True)
    first = decider(service, [])
    if not isinstance(first, Launch):
        raise RuntimeError(f"gpushare refused the service on an idle GPU: {first}")
    verdict = decider(train, [Running(service, first)])
    if isinstance(verdict, Launch):
        launch, note = verdict, "admitted"
    else:
        beside = [v for v in decider.variants(train) if (v.thread_percent or 100) < 100]
        launch = beside[0] if beside else decider.variants(train)[0]
        note = f"admission would refuse ({verdict}); run anyway to measure protection"
    cap = launch.thread_percent or 100
    prio = MPS_PRIORITY_BY_CLASS
    alone = Member("infer", 100, 0)
    svc = Member("infer", first.thread_percent or 100, 1)
    trainer = Member("resnet50", cap, 1)
    uncapped = Member("resnet50", 100, 2)
    priority = {svc: prio["latency"], trainer: prio["batch"], uncapped: prio["batch"]}
    members = {
        SOLO_NO_MPS: [alone],
        SOLO_MPS: [svc],
        SHARED: [svc, trainer],
        UNCAPPED: [svc, uncapped],
    }
    failed = pool.ensure(
        {alone, svc, trainer, uncapped}, priority=priority.get, no_mps=frozenset({alone})
    )
    if failed:
        raise RuntimeError(f"latency workers failed to start: {failed}")
    got: dict[str, list[list[dict[str, Any]]]] = {k: [] for k in members}
    order: list[list[str]] = []
    # An untimed window first: each service process's first requests are slow (CUDA, cuDNN).
    for m in (alone, svc):
        pool.window([m], seconds=2.0, seed=99, settle=True)
    for r in range(0 if rotate_uncapped else calibration_rounds):
        # Context only, never pooled with the reported rows.
        order.append([f"context {r}: {UNCAPPED}"])
        got[UNCAPPED].append(
            pool.window(members[UNCAPPED], seconds=window_s, seed=500 + r, settle=True)
        )
    rotated = [SOLO_NO_MPS, SOLO_MPS, SHARED] + ([UNCAPPED] if rotate_uncapped else [])
    reported = rotations(rotated, rounds)
    for r, settings in enumerate(reported):
        order.append(settings)
        for s in settings:
            got[s].append(pool.window(members[s], seconds=window_s, seed=7 + r, settle=True))
    rows = {k: _row(k, v, train_solo) for k, v in got.items() if v}
    no_mps = rows[SOLO_NO_MPS].get("p99_ms")
    mps = rows[SOLO_MPS].get("p99_ms")
    shared = rows[SHARED].get("p99_ms")
    return {
        "rows": list(rows.values()),
        "solo_p99_ms": no_mps,
        "solo_mps_p99_ms": mps,
        "shared_p99_ms": shared,
        "shared_over_solo_no_mps": round(shared / no_mps, 3) if shared and no_mps else None,
        "shared_over_solo_mps": round(shared / mps, 3) if shared and mps else None,
        "train_retained_ratio": rows[SHARED].get("train_share"),
        "training_cap": cap,
        "service_threads": first.thread_percent or 100,
        "gpushare_admission": note,
        "training_launch": launch.note,
        "window_s": window_s,
        "rounds": rounds,
        "calibration_rounds": 0 if rotate_uncapped else calibration_rounds,
        "uncapped_rotated": rotate_uncapped,
        "order": order,
    }
