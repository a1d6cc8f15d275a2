"""One benchmark job as its own process (MPS clients are processes).

The coordinator starts the process early so that ``import torch`` is paid before the clock
starts; CUDA is first touched only when a command arrives, after the command's environment
(MPS pipe directory, active-thread percentage, client priority) has been applied, because the
CUDA driver reads those variables when it initialises. A warm trace job is initialised and
warmed up before the trace's clock starts (with the MPS settings their scheme will give them),
so its completion time measures GPU sharing, not process start-up (reported separately); a
cold one (``warmup.plan``: the same jobs under every scheme) initialises when it is launched.

Protocol: JSON commands on stdin, one per line; JSON events on stdout, prefixed ``@@ ``.

- ``{"cmd": "init", "kind", "env"[, "release": true]}`` then ``{"cmd": "run", "iterations"}``:
  a trace job, warmed up before the trace starts (with ``release``, its warm-up's activations
  given back and ``ready`` saying the GPU memory it then holds, ``idle_mib``), then a fixed
  amount of work; reports
  ``started`` when the work begins, then ``done`` with ``t_go``, ``t_end`` (wall clock),
  request latencies and memory, and exits.
- ``{"cmd": "job", "kind", "env", "iterations"}``: the same started cold, inside the clock:
  ``started`` comes once CUDA, the model and its two warm-up steps are ready.
- ``{"cmd": "init", "kind", "env"}`` then any number of
  ``{"cmd": "window", "start", "end"}``: run back to back (or serve Poisson requests) inside
  the window and report the rate; used for solo profiles and colocation packs.
- ``{"cmd": "quit"}``.
"""

import argparse
import importlib
import json
import os
import sys
import time
from typing import Any

from bench.gpu.catalog import kind as job_kind
from bench.gpu.stats import poisson_arrivals

EVENT_PREFIX = "@@ "


def emit(event: str, **fields: Any) -> None:
    print(EVENT_PREFIX + json.dumps({"event": event, **fields}), flush=True)


def _sleep_until(t: float) -> None:
    delay = t - time.time()
    if delay > 0:
        time.sleep(delay)


# Per-step seconds of the dry-run stand-in (``--device sleep``): exercises the harness only.
_DRY_STEP_S = {
    "resnet18": 0.004,
    "resnet50": 0.02,
    "resnet50_xl": 0.04,
    "transformer": 0.015,
    "transformer_xl": 0.03,
    "lstm": 0.008,
    "dgemm": 0.02,
    "infer": 0.005,
    "gpt2": 0.02,
    "bert": 0.01,
    "vit": 0.02,
    "bgemm": 0.02,
}
_DRY_STEP_S["notebook"] = job_kind("notebook").burst * _DRY_STEP_S["resnet18"]


class _DryWorkload:
    def __init__(self, kind: str) -> None:
        self.seconds = _DRY_STEP_S[kind] + job_kind(kind).idle_s

    def step(self) -> None:
        time.sleep(self.seconds)


PRELOADS: dict[str, tuple[str, ...]] = {
    "gpt2": ("transformers",),
    "bert": ("transformers",),
    "vit": ("torchvision",),
}
"""Modules a kind's model is built from beyond torch: a process started for that kind imports
them with torch, before the trace's clock (``--preload``), so a start inside the clock pays
only CUDA, the model and its warm-up steps."""


def preload(kind: str) -> None:
    for module in PRELOADS.get(kind, ()):
        importlib.import_module(module)


class _Runner:
    def __init__(self, *, device_name: str, tiny: bool) -> None:
        self.torch: Any = None
        if device_name != "sleep":
            import torch  # noqa: PLC0415  (only workers import torch)

            self.torch = torch
            torch.set_num_threads(1)
        self.device_name = device_name
        self.tiny = tiny
        self.workload: Any = None
        self.kind = ""

    def init(self, kind: str, env: dict[str, str], *, release: bool = False) -> float:
        """Apply MPS settings, touch CUDA, build the job and warm it up; returns seconds. With
        ``release``, the allocator then gives back what the warm-up step's activations held:
        a warm process waiting for its job keeps only its model, optimizer and batch (its
        job's first step allocates the rest again; docs/benchmarks-gpu.md, "Warm or cold")."""
        t0 = time.time()
        self.kind = kind
        if self.device_name == "sleep":
            self.workload = _DryWorkload(kind)
            return time.time() - t0
        from bench.gpu.workloads import build  # noqa: PLC0415  (imports torch)

        if self.device_name == "cuda" and self.torch.cuda.is_initialized():
            raise RuntimeError("CUDA was initialised before the MPS environment was applied")
        os.environ.update(env)
        device = self.torch.device(self.device_name)
        if self.device_name == "cuda":
            self.torch.cuda.init()
            _nvml_process_mib(os.getpid())  # NVML opened before the clock, read after the work
        self.workload = build(kind, device=device, tiny=self.tiny)
        for _ in range(2):
            self.workload.step()
        if release and self.device_name == "cuda":
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()
        return time.time() - t0

    def peak_mib(self) -> int | None:
        """GPU memory this process's allocator held at its peak, in MiB (None off CUDA)."""
        if self.device_name != "cuda" or self.torch is None:
            return None
        return int(self.torch.cuda.max_memory_reserved() // (1 << 20))

    def process_mib(self) -> int | None:
        """GPU memory NVML lists for this process, in MiB, its CUDA context included: what
        gpushare's profiler reads of the job running alone (``memory_used_bytes_max``), and
        its allocator never gives back what it reserved, so at the end it is the peak. None
        off CUDA or where NVML cannot say."""
        if self.device_name != "cuda":
            return None
        return _nvml_process_mib(os.getpid())

    def run_iterations(self, n: int) -> list[float]:
        for _ in range(n):
            self.workload.step()
        return []

    def serve(
        self, *, start: float, end: float | None, count: int | None, seed: int
    ) -> list[float]:
        """Serve Poisson requests from ``start``; latency = completion - arrival (ms)."""
        rate = job_kind(self.kind).request_rate_hz
        latencies: list[float] = []
        for arrival in poisson_arrivals(rate_hz=rate, start=start, end=end, count=count, seed=seed):
            _sleep_until(arrival)
            self.workload.step()
            latencies.append((time.time() - arrival) * 1000.0)
        return latencies

    def window(self, *, start: float, end: float, seed: int, settle: bool) -> dict[str, Any]:
        _sleep_until(start)
        if job_kind(self.kind).poisson:
            lat = self.serve(start=start, end=end, count=None, seed=seed)
            warm = settled_after(lat) if settle else 0
            return {
                "rate": len(lat) / (end - start),
                "iters": len(lat),
                "latencies_ms": lat[warm:],
                "warmup_requests": warm,
            }
        done: list[float] = []
        while True:
            self.workload.step()
            now = time.time()
            if now <= end or not done:  # a starved job still reports one (late) step
                done.append(now)
            if now > end:
                break
        rate = len(done) / (done[-1] - start) if done else 0.0
        return {"rate": rate, "iters": len(done), "latencies_ms": []}


SETTLE_BLOCK = 20
SETTLE_TOLERANCE = 0.10


def settled_after(latencies: list[float]) -> int:
    """Requests of a latency window that are warm-up: up to the end of the first block of
    SETTLE_BLOCK requests whose median is within SETTLE_TOLERANCE of the previous block's
    (the service's p50 has settled), at most half of them. Causal: the cut depends only on the
    requests before it, as if the window had started counting there."""
    block = SETTLE_BLOCK
    previous: float | None = None
    for k in range(len(latencies) // block):
        current = sorted(latencies[k * block : (k + 1) * block])[block // 2]
        if previous is not None and abs(current - previous) <= SETTLE_TOLERANCE * previous:
            return min((k + 1) * block, len(latencies) // 2)
        previous = current
    return len(latencies) // 2


def _nvml_process_mib(pid: int) -> int | None:
    """``pid``'s GPU memory over every GPU NVML lists it on (compute processes and MPS
    clients), in MiB; None where NVML is missing or does not list it."""
    try:
        import pynvml  # noqa: PLC0415  (optional: absent where there is no GPU)

        pynvml.nvmlInit()
        used = 0
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for name in (
                "nvmlDeviceGetComputeRunningProcesses",
                "nvmlDeviceGetMPSComputeRunningProcesses",
            ):
                for proc in getattr(pynvml, name)(handle):
                    if int(proc.pid) == pid and proc.usedGpuMemory:
                        used = max(used, int(proc.usedGpuMemory))
        return used // (1 << 20) or None
    except Exception:  # a reading, never a reason to fail the job
        return None


def _work_and_report(runner: _Runner, msg: dict[str, Any], *, t_go: float, t_ready: float) -> None:
    """Do the job's counted work from ``t_ready`` (requests for a service, iterations for any
    other kind) and emit ``done`` with its times, request latencies and peak GPU memory."""
    if job_kind(runner.kind).poisson:
        lat = runner.serve(
            start=t_ready, end=None, count=int(msg["iterations"]), seed=msg.get("seed", 0)
        )
    else:
        lat = runner.run_iterations(int(msg["iterations"]))
    t_end = time.time()
    emit("done", t_go=t_go, t_ready=t_ready, t_end=t_end, latencies_ms=lat,
         peak_mib=runner.peak_mib(), process_mib=runner.process_mib())  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu", "sleep"),
        help="sleep: no torch, steps just sleep (dry run of the harness, not a benchmark)",
    )
    parser.add_argument("--tiny", action="store_true", help="tiny models (CPU smoke test)")
    parser.add_argument("--label", default="", help="name shown in the coordinator's logs")
    parser.add_argument(
        "--preload", default="", metavar="KIND", help="import what KIND is built from, now"
    )
    args = parser.parse_args(argv)
    runner = _Runner(device_name=args.device, tiny=args.tiny)
    if args.preload and args.device != "sleep":
        preload(args.preload)
    torch = runner.torch
    emit(
        "imported",
        pid=os.getpid(),
        torch=torch.__version__ if torch else None,
        cuda=torch.version.cuda if torch else None,
    )
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        cmd = msg["cmd"]
        try:
            if cmd == "quit":
                break
            if cmd == "init":
                release = bool(msg.get("release", False))
                init_s = runner.init(msg["kind"], msg.get("env", {}), release=release)
                emit("ready", init_s=init_s, idle_mib=runner.process_mib() if release else None)
            elif cmd == "window":
                emit(
                    "window",
                    **runner.window(
                        start=msg["start"],
                        end=msg["end"],
                        seed=msg.get("seed", 0),
                        settle=bool(msg.get("settle", False)),
                    ),
                    peak_mib=runner.peak_mib(),
                    process_mib=runner.process_mib(),
                )
            elif cmd == "run":
                t_go = time.time()
                emit("started", t_ready=t_go)
                _work_and_report(runner, msg, t_go=t_go, t_ready=t_go)
                break
            elif cmd == "job":
                t_go = time.time()
                init_s = runner.init(msg["kind"], msg.get("env", {}))
                t_ready = time.time()
                emit("started", t_ready=t_ready, init_s=init_s)
                _work_and_report(runner, msg, t_go=t_go, t_ready=t_ready)
                break
            else:
                raise ValueError(f"unknown command {cmd!r}")
        except Exception as exc:  # report, then exit non-zero: the coordinator records it
            emit("error", error=f"{type(exc).__name__}: {exc}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
