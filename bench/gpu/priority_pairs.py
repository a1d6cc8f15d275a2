"""Does MPS client priority protect a job that keeps the GPU busy from a neighbour that does too?

An experiment, not part of the benchmark's decisions: it asks whether "backfill" could beat the
heavy trace's target. The idea is to start a whole-GPU job beside a running one at MPS priority
1 (below normal) and let it soak up what the first leaves. That only pays if the job at
priority 0 keeps close to its solo rate. Each pair runs uncapped under one MPS daemon, both
ways round and at equal priority, next to each job's solo rate (MPS, priority 0). Windows are
``--window-s`` long, two per setting, after each worker's warm-up.

    python3 -m bench.gpu.priority_pairs --out DIR [--gpu 0]
    python3 -m bench.gpu.priority_pairs --out DIR --sets resnet50_xl+transformer_xl,...

Writes DIR/priority-pairs.json. Results: docs/benchmarks-gpu.md ("Run 12"). ``--sets`` instead
runs each named set of kinds together, every job uncapped at priority 1 (a batch pod's), beside
each kind's solo rate, and records how many jobs' worth of work the set did per second (the sum
of its members' rates over their solo rates): how much overlapping them can gain at most
(docs/benchmarks-gpu.md, "Run 26").
"""

import argparse
import json
import time
from pathlib import Path
from typing import Any

from bench.gpu.catalog import KINDS
from bench.gpu.mps import MpsDaemon, client_env
from bench.gpu.procs import Workers

PAIRS = (("resnet50_xl", "transformer_xl"), ("transformer_xl", "dgemm"))
"""Jobs that each keep the GPU busy alone (bench/gpu/catalog.py)."""
WINDOWS = 2


def measure(
    workers: Workers, mps: MpsDaemon, members: list[tuple[str, int]], *, label: str, window_s: float
) -> list[list[float]]:
    """Rates (iterations/s) of ``members`` ((kind, MPS priority)) run together, per window."""
    started = workers.start_many(
        [f"{label}-{i}-{k}" for i, (k, _) in enumerate(members)], timeout_s=120
    )
    for worker, (kind, priority) in zip(started, members, strict=True):
        env = client_env(pipe_dir=mps.pipe_dir, thread_percent=100, priority=priority)
        worker.send({"cmd": "init", "kind": kind, "env": env})
    for worker in started:
        workers.expect(worker, "ready", timeout_s=180)
    rates = []
    for _ in range(WINDOWS):
        start = time.time() + 0.2
        for worker in started:
            worker.send({"cmd": "window", "start": start, "end": start + window_s})
        windows = [workers.expect(w, "window", timeout_s=window_s + 60) for w in started]
        rates.append([float(w["rate"]) for w in windows])
    workers.close_all()
    return rates


def parse_sets(text: str) -> list[tuple[str, ...]]:
    """``a+b,a+b+c`` -> [(a, b), (a, b, c)]; every kind must be in the catalog."""
    sets = [tuple(k.strip() for k in part.split("+")) for part in text.split(",") if part.strip()]
    for members in sets:
        unknown = [k for k in members if k not in KINDS]
        if unknown or len(members) < 2:
            raise argparse.ArgumentTypeError(
                f"{'+'.join(members)!r}: "
                + (f"unknown kind {unknown[0]!r}" if unknown else "a set needs two kinds or more")
                + f"; kinds: {', '.join(sorted(KINDS))}"
            )
    return sets


def jobs_worth(rates: list[float], kinds: tuple[str, ...], solo: dict[str, float]) -> float:
    """Jobs' worth of work per second: each member's rate over its kind's solo rate, summed."""
    return round(sum(r / solo[k] for r, k in zip(rates, kinds, strict=True)), 3)


def measure_sets(
    workers: Workers, mps: MpsDaemon, sets: list[tuple[str, ...]], *, out: Path, window_s: float
) -> None:
    """Each kind alone (priority 0), then each set together at priority 1, written as they
    come to ``out``/priority-pairs.json."""
    results: list[dict[str, Any]] = []
    solo: dict[str, float] = {}

    def record(entry: dict[str, Any]) -> None:
        results.append(entry)
        print(json.dumps(entry), flush=True)
        (out / "priority-pairs.json").write_text(json.dumps(results, indent=1) + "\n")

    for kind in sorted({k for members in sets for k in members}):
        rates = measure(workers, mps, [(kind, 0)], label=f"solo_{kind}", window_s=window_s)
        solo[kind] = sum(w[0] for w in rates) / len(rates)
        record({"setting": f"solo {kind}", "members": [(kind, 0)], "rates": rates})
    for members in sets:
        label = " + ".join(members)
        rates = measure(
            workers, mps, [(k, 1) for k in members], label=label.replace(" ", ""), window_s=window_s
        )
        worth = [jobs_worth(w, members, solo) for w in rates]
        record(
            {
                "setting": label,
                "members": [(k, 1) for k in members],
                "rates": rates,
                "jobs_worth": worth,
            }
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for results and logs")
    parser.add_argument("--gpu", default="0", help="GPU index (default 0)")
    parser.add_argument("--window-s", type=float, default=4.0, help="seconds per window")
    parser.add_argument(
        "--sets",
        type=parse_sets,
        help="instead of the priority pairs: sets of kinds run together, e.g. a+b,a+b+c",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    with MpsDaemon(gpu=args.gpu) as mps:
        workers = Workers(
            device="cuda", tiny=False, log_dir=args.out, base_env={"CUDA_VISIBLE_DEVICES": args.gpu}
        )
        if args.sets:
            measure_sets(workers, mps, args.sets, out=args.out, window_s=args.window_s)
            return
        for a, b in PAIRS:
            settings = {
                f"solo {a}": [(a, 0)],
                f"solo {b}": [(b, 0)],
                f"{a} p0 + {b} p1": [(a, 0), (b, 1)],
                f"{a} p1 + {b} p0": [(a, 1), (b, 0)],
                f"{a} p1 + {b} p1": [(a, 1), (b, 1)],
            }
            for label, members in settings.items():
                rates = measure(
                    workers, mps, members, label=label.replace(" ", "_"), window_s=args.window_s
                )
                results.append({"setting": label, "members": members, "rates": rates})
                print(json.dumps(results[-1]), flush=True)
                (args.out / "priority-pairs.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
