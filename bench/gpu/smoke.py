"""Check a GPU host before a full run (about a minute): every job kind builds and steps under
the benchmark's MPS daemon, and a process outside MPS runs beside the daemon's clients (the
latency experiment and whole-GPU jobs need both).

    PYTHONPATH=. python3 -m bench.gpu.smoke

Prints one JSON line per check and exits non-zero when any failed.
"""

import json
import sys
import tempfile
import time
from pathlib import Path

from bench.gpu.catalog import KINDS
from bench.gpu.colocate import Member
from bench.gpu.mps import MpsDaemon
from bench.gpu.procs import Workers
from bench.gpu.runner import Pool


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="gpushare-smoke-"))
    daemon = MpsDaemon(gpu="0")
    daemon.start()
    pool = Pool(Workers(device="cuda", tiny=False, log_dir=tmp, base_env={}), daemon.pipe_dir, {})
    outside = Member("infer", 100, 9)
    members = {Member(k, 100) for k in KINDS} | {outside}
    ok = True
    try:
        t0 = time.time()
        failed = pool.ensure(members, priority=lambda m: None, no_mps=frozenset({outside}))
        why = {m.label: text[-300:] for m, text in failed.items()}
        print(json.dumps({"check": "start-up", "s": round(time.time() - t0, 1), "failed": why}))
        ok = not failed
        for m in sorted(pool.live, key=lambda m: m.label):
            if m == outside:
                continue
            rate = pool.window([m], seconds=1.0)[0]["rate"]
            print(json.dumps({"check": m.kind, "rate": round(float(rate), 2)}))
        if outside in pool.live and Member("resnet50", 100) in pool.live:
            both = pool.window([outside, Member("resnet50", 100)], seconds=2.0, settle=True)
            check = {"check": "outside MPS beside a client", "train_rate": both[1]["rate"]}
            print(json.dumps({**check, "requests": len(both[0]["latencies_ms"])}))
    finally:
        pool.close()
        daemon.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
