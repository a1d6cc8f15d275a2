"""Check a GPU host before a full run (about a minute): every job kind builds and steps under
the benchmark's MPS daemon, a process outside MPS runs beside the daemon's clients (the
latency experiment and whole-GPU jobs need both), and how long a cold start takes inside a
trace's clock (CUDA, model, two steps, from a process that imported its libraries before).
Without a GPU, ``python3 -m bench.gpu.run --dry`` checks the harness instead.

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
from bench.gpu.mps import MpsDaemon, client_env
from bench.gpu.procs import Workers
from bench.gpu.runner import Pool

COLD_KINDS = ("resnet18", "gpt2", "resnet50_xl")
"""A small job, one built from ``transformers``, the largest: their cold starts bound a trace's."""


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
        pool.close()  # the cold starts run on an otherwise idle GPU
        ok = cold_starts(pool.workers, daemon) and ok
    finally:
        pool.close()
        daemon.stop()
    return 0 if ok else 1


def cold_starts(workers: Workers, daemon: MpsDaemon) -> bool:
    """Each of :data:`COLD_KINDS` started cold, one after another, as a trace's clock starts a
    cold job: seconds from the command to its first counted step."""
    ok = True
    for kind in COLD_KINDS:
        w = workers.spawn(f"cold-{kind}", preload=kind)
        env = client_env(pipe_dir=daemon.pipe_dir, thread_percent=None, priority=None)
        try:
            workers.expect(w, "imported", timeout_s=240)
            t_go = time.time()
            w.send({"cmd": "job", "kind": kind, "env": env, "iterations": 3, "seed": 0})
            started = workers.expect(w, "started", timeout_s=180)
            workers.expect(w, "done", timeout_s=180)
        except Exception as exc:  # a check's failure is printed, never raised
            print(json.dumps({"check": f"cold start {kind}", "error": str(exc)[-300:]}))
            ok = False
            continue
        wait = round(float(started["t_ready"]) - t_go, 2)
        print(json.dumps({"check": f"cold start {kind}", "s": wait}))
    return ok


if __name__ == "__main__":
    sys.exit(main())
