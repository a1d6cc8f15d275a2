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

from bench.gpu import latency
from bench.gpu.decide import ProductDecider
from bench.gpu.mps import MpsDaemon
from bench.gpu.procs import Workers
from bench.gpu.run import pipe_profile
from bench.gpu.runner import Pool

log = logging.getLogger("bench.gpu")


def gpu_identity(index: int) -> tuple[str, int]:
    """The GPU's name and memory in bytes, from NVML."""
    import pynvml  # noqa: PLC0415  (only on a GPU host)

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    finally:
        pynvml.nvmlShutdown()
    return (name.decode() if isinstance(name, bytes) else str(name)), memory


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
    gpu, memory = ("none (dry run)", 80 * 2**30) if args.dry else gpu_identity(args.gpu)
    decider = ProductDecider(
        profiles={k: pipe_profile(v, gpu_model=gpu) for k, v in profiles.items()},
        gpu_model=gpu,
        gpu_memory_bytes=memory,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="gpushare-latency-ab-") as tmp:
        daemon = None if args.dry else MpsDaemon(gpu=str(args.gpu))
        if daemon is not None:
            daemon.start()
        workers = Workers(
            device="sleep" if args.dry else "cuda",
            tiny=False,
            log_dir=Path(tmp),
            base_env={"CUDA_VISIBLE_DEVICES": str(args.gpu)},
        )
        pool = Pool(workers, daemon.pipe_dir if daemon else Path(tmp) / "no-mps", {})
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
        "gpu": gpu,
        "dry_run": args.dry,
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
