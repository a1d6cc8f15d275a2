"""Does checkpointing a paused MPS client give its GPU memory back, and lose nothing?

Two GEMM processes share the GPU (as clients of one private MPS daemon; with ``--without-mps``
again without). The probe suspends A through :mod:`bench.gpu.cuda_checkpoint` (lock,
checkpoint), stops it (SIGSTOP, as the freezer would), then continues and restores it. It
records the GPU memory in use, B's rate with A running and suspended, A's rate after, how long
each call took, A's host memory, and whether A's data and a fixed GEMM chain came back
bit-identical. Evidence for docs/node-agent.md, "Pausing a pod".

    python -m bench.gpu.offload_probe --out probe.json

"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu.cuda_checkpoint import CheckpointError, CudaCheckpoint
from bench.gpu.mps import MpsDaemon, client_env

CHAIN = 200
SIDE = 8192


def worker(mib: int, seconds: float) -> None:
    """One GEMM loop holding ``mib`` MiB; prints progress lines and, at the end, whether its
    data and a fixed chain are as they were before the loop."""
    import torch  # noqa: PLC0415 - only the worker needs it

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    big = torch.randn(mib * 2**18, device=dev, generator=gen)
    x = torch.randn(SIDE, SIDE, device=dev, generator=gen).to(torch.bfloat16) / SIDE**0.5

    def chain() -> int:
        y = x
        for _ in range(CHAIN):
            y = torch.tanh(y @ x)
        return int(y.view(torch.int16).to(torch.int64).sum().item())

    def data() -> int:
        return int(big.view(torch.int32).to(torch.int64).sum().item())

    ref_chain, ref_data = chain(), data()
    print(json.dumps({"ready": os.getpid()}), flush=True)
    y, n, start = x, 0, time.monotonic()
    while time.monotonic() - start < seconds:
        for _ in range(20):
            y = torch.tanh(y @ x)
        torch.cuda.synchronize()
        n += 20
        print(json.dumps({"t": time.time(), "iters": n}), flush=True)
    print(json.dumps({"chain_same": chain() == ref_chain, "data_same": data() == ref_data}))


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[str]
    lines: list[dict[str, Any]] = field(default_factory=list)

    def follow(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            if line.startswith("{"):
                self.lines.append(json.loads(line))

    def rate(self, lo: float, hi: float) -> float | None:
        pts = [(d["t"], d["iters"]) for d in self.lines if "t" in d and lo <= d["t"] <= hi]
        if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
            return None
        return round((pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]), 1)


def _start(name: str, mib: int, seconds: float, env: dict[str, str]) -> Proc:
    cmd = [sys.executable, "-m", "bench.gpu.offload_probe", "--worker", str(mib), str(seconds)]
    popen = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=subprocess.PIPE, text=True)
    proc = Proc(name, popen)
    threading.Thread(target=proc.follow, daemon=True).start()
    return proc


def _used_mib() -> int:
    import pynvml  # noqa: PLC0415 - only on the GPU host

    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used) // 2**20


def _rss_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return -1


def one(mps: bool, mib_a: int, mib_b: int) -> dict[str, Any]:
    """One round: A and B start, A is suspended for a while, then restored."""
    out: dict[str, Any] = {"mps": mps, "a_mib": mib_a, "b_mib": mib_b}
    daemon = MpsDaemon(gpu=os.environ.get("CUDA_VISIBLE_DEVICES", "0")) if mps else None
    if daemon:
        daemon.start()
    try:
        env = client_env(
            pipe_dir=daemon.pipe_dir if daemon else None, thread_percent=None, priority=None
        )
        a, b = _start("a", mib_a, 16, env), _start("b", mib_b, 16, env)
        deadline = time.monotonic() + 120
        while not all(any("ready" in d for d in p.lines) for p in (a, b)):
            if time.monotonic() > deadline or a.popen.poll() is not None:
                raise RuntimeError("workers did not start")
            time.sleep(0.1)
        pid = a.popen.pid
        ck = CudaCheckpoint()
        time.sleep(3)
        t_run = time.time()
        out["used_mib_both"] = _used_mib()
        out["rss_a_mib_before"] = _rss_mib(pid)
        t0 = time.monotonic()
        try:
            ck.lock(pid)
            t1 = time.monotonic()
            ck.checkpoint(pid)
            t2 = time.monotonic()
        except CheckpointError as exc:
            out["error"] = str(exc)
            a.popen.kill()
            b.popen.kill()
            return out
        os.kill(pid, signal.SIGSTOP)
        out["lock_s"], out["checkpoint_s"] = round(t1 - t0, 3), round(t2 - t1, 3)
        out["state_suspended"] = ck.state(pid).name
        time.sleep(0.5)
        t_sus = time.time()
        out["used_mib_a_suspended"] = _used_mib()
        out["rss_a_mib_suspended"] = _rss_mib(pid)
        time.sleep(3)
        t_sus_end = time.time()
        os.kill(pid, signal.SIGCONT)
        t3 = time.monotonic()
        ck.restore(pid)
        t4 = time.monotonic()
        ck.unlock(pid)
        out["restore_s"], out["unlock_s"] = round(t4 - t3, 3), round(time.monotonic() - t4, 3)
        out["state_resumed"] = ck.state(pid).name
        t_back = time.time()
        time.sleep(3)
        out["used_mib_resumed"] = _used_mib()
        out["rss_a_mib_resumed"] = _rss_mib(pid)
        a.popen.wait(60)
        b.popen.wait(60)
        time.sleep(0.3)
        out["rate"] = {
            "a_shared": a.rate(t_run - 2, t_run),
            "b_shared": b.rate(t_run - 2, t_run),
            "b_a_suspended": b.rate(t_sus, t_sus_end),
            "a_resumed": a.rate(t_back + 0.5, t_back + 2.5),
            "b_a_resumed": b.rate(t_back + 0.5, t_back + 2.5),
        }
        ends = [d for d in a.lines if "chain_same" in d]
        out["a_end"] = ends[-1] if ends else None
        out["a_rc"], out["b_rc"] = a.popen.returncode, b.popen.returncode
    finally:
        if daemon:
            out["mps_log"] = daemon.log_tail(5)
            daemon.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--a-mib", type=int, default=8192)
    parser.add_argument("--b-mib", type=int, default=2048)
    parser.add_argument("--without-mps", action="store_true", help="also a round without MPS")
    parser.add_argument("--worker", nargs=2, metavar=("MIB", "SECONDS"))
    args = parser.parse_args(argv)
    if args.worker:
        worker(int(args.worker[0]), float(args.worker[1]))
        return 0
    import pynvml  # noqa: PLC0415 - only on the GPU host

    pynvml.nvmlInit()
    rounds = []
    for mps in (True, False) if args.without_mps else (True,):
        try:
            rounds.append(one(mps, args.a_mib, args.b_mib))
        except Exception as exc:  # a probe reports what failed and goes on
            rounds.append({"mps": mps, "error": repr(exc)})
        print(json.dumps(rounds[-1]), flush=True)
    result = {
        "gpu": pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)),
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "rounds": rounds,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
