"""The full fault run: every component killed during a burst of 200 fractional pods.

    .venv/bin/python -m bench.faults.run_faults [--pods 200] [--out faults.json]

Runs tests/faults/test_faults_cluster.py against the local cluster with GPUSHARE_FAULT_PODS set
(CI runs the same tests with 24 pods) and merges the figures into
bench/results/reliability.json (bench/faults/summary.py). Destructive for anyone else using the
cluster: each test waits until no other pytest runs.
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.faults import summary

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--down-s", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=None, help="faults JSON (default: temp file)")
    parser.add_argument("-k", default=None, help="pytest -k expression (e.g. one component)")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="gsfaults-")) / "faults.json"
    env = {
        **os.environ,
        "GPUSHARE_FAULT_PODS": str(args.pods),
        "GPUSHARE_FAULT_DOWN_S": str(args.down_s),
        "GPUSHARE_RELIABILITY_OUT": str(out),
    }
    command = [sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider",
               "tests/faults/test_faults_cluster.py"]  # fmt: skip
    if args.k:
        command += ["-k", args.k]
    code = subprocess.run(command, cwd=REPO, env=env, check=False).returncode
    if out.exists():
        summary.main(["--faults", str(out)])
    return code


if __name__ == "__main__":
    sys.exit(main())
