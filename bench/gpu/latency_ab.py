"""Does the cap on a latency pod's batch neighbour buy latency that MPS priority alone does not?

    PYTHONPATH=. python3 -m bench.gpu.latency_ab --phase-a FILE --out DIR [--rounds 8]

gpushare caps a batch pod placed beside a latency-class pod (``threads.LATENCY_NEIGHBOUR_THREADS``)
on top of running it at MPS client priority 1. The GPU benchmark's latency stage measures the
service beside training with gpushare's settings, and training uncapped at priority 1 only as
context, in two windows run before the reported ones. Here that uncapped setting is a reported
setting rotated with the others (``latency.measure(rotate_uncapped=True)``), every setting in
every place equally often, so the two can be compared. Profiles and the training job's solo
rate come from a phase-A file of the same GPU model (``run --phase colocations``). Writes
``latency-ab.json``. Evidence: docs/benchmarks-gpu.md, "Run 18".
"""

import argparse
import json
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.gpu import latency, run
from bench.gpu.decide import ProductDecider
from bench.gpu.runner import Pool

log = logging.getLogger("bench.gpu")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.gpu.latency_ab",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--phase-a", type=Path, required=True, help="phase-a.json of this GPU model")
    p.add_argument("--out", type=Path, required=True, help="directory for latency-ab.json")
    p.add_argument("--rounds", type=int, default=8, help="rounds (a multiple of 4 balances order)")
    p.add_argument("--window-s", type=float, default=4.0, help="seconds per window (default 4)")
    p.add_argument("--gpu", type=int, default=0, help="GPU index (default 0)")
    p.add_argument(
        "--dry", action="store_true", help="no GPU: workers sleep; checks the harness only"
    )
    args = p.parse_args(argv)
    if args.rounds < 1 or not 1.0 <= args.window_s <= 60.0:
        p.error("--rounds must be >= 1 and --window-s between 1 and 60")
    try:
        phase_a = json.loads(args.phase_a.read_text())
        profiles = phase_a["profiles"]
        train_solo = float(phase_a["solo"]["resnet50"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        p.error(f"--phase-a: {args.phase_a} is not a phase-a.json with profiles and solo rates "
                f"({type(exc).__name__}: {exc})")  # fmt: skip
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="gpushare-latency-ab-") as tmp:
        # The GPU benchmark's own context: GPU name and memory, workers, the MPS daemon.
        ctx = run.Ctx(args=args, t_start=started, tmp=Path(tmp))
        run.gpu_info(ctx)
        decider = ProductDecider(
            profiles={k: run.pipe_profile(v, gpu_model=ctx.gpu_name) for k, v in profiles.items()},
            gpu_model=ctx.gpu_name,
            gpu_memory_bytes=ctx.memory_bytes,
        )
        daemon = ctx.daemon()
        pool = Pool(ctx.workers(), ctx.pipe(daemon), {})
        try:
            result = latency.measure(
                pool=pool,
                decider=decider,
                train_solo=train_solo,
                window_s=args.window_s,
                rounds=args.rounds,
                calibration_rounds=0,
                rotate_uncapped=True,
            )
        finally:
            pool.close()
            if daemon is not None:
                daemon.stop()
    record = {
        "gpu": ctx.gpu_name,
        "dry_run": args.dry,
        "errors": ctx.errors,
        "phase_a": str(args.phase_a),
        "run_s": round(time.time() - started, 1),
        **result,
    }
    (args.out / "latency-ab.json").write_text(json.dumps(record, indent=1) + "\n")
    for row in result["rows"]:
        log.info(
            "%-70s p99 %7s ms  by window %s  training share %s",
            row["setting"],
            row.get("p99_ms"),
            row.get("p99_ms_by_window"),
            row.get("train_share"),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
