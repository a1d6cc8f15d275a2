"""Processes of the bench: the KWOK control plane (hack/kwok-cluster.sh) and the controller.

Each process is started by this module and stopped by its PID; CPU time per process is read from
/proc so a result says which component the run was waiting on.
"""

import asyncio
import importlib.util
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "kwok-cluster.sh"
DEFAULT_STATE_DIR = Path("/var/lib/gpushare-scale")
KUBE_SCHEDULER_PORT = 10359
GPUSHARE_SCHEDULER_PORT = 10361
DEFAULT_EXTENDER_PORT = 18888
COMPONENTS = ("etcd", "kube-apiserver", "kube-scheduler", "gpushare-scheduler", "kwok")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class HarnessError(Exception):
    """A component would not start; the message says where its log is."""


@dataclass
class ControlPlane:
    """The running KWOK control plane of hack/kwok-cluster.sh."""

    state_dir: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "admin.kubeconfig"

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    def script(self, *args: str, timeout: float = 900) -> str:
        proc = subprocess.run(
            ["bash", str(SCRIPT), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            check=False,
        )
        if proc.returncode != 0:
            raise HarnessError(
                f"hack/kwok-cluster.sh {shlex.join(args)} failed:\n{proc.stderr[-3000:]}"
            )
        return proc.stdout

    def pids(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for name in COMPONENTS:
            path = self.state_dir / "run" / f"{name}.pid"
            if path.is_file():
                out[name] = int(path.read_text().strip())
        return out


def control_plane_up(
    *,
    state_dir: Path,
    extender_port: int,
    gpushare_nodes_percent: int | None = None,
    feature_gates: str = "",
    dra: bool = False,
) -> ControlPlane:
    """Start a fresh control plane (removing any earlier state of this harness); ``dra`` runs
    the DRA mode's Kubernetes release (DRA_KUBE_VERSION in hack/lib/versions.sh)."""
    env = dict(os.environ)
    env["GPUSHARE_SCALE_FEATURE_GATES"] = feature_gates
    env["GPUSHARE_SCALE_DRA"] = "1" if dra else "0"
    env["GPUSHARE_SCALE_STATE_DIR"] = str(state_dir)
    env["GPUSHARE_SCALE_EXTENDER_URL"] = f"http://127.0.0.1:{extender_port}/scheduler"
    env.pop("GPUSHARE_SCALE_GPUSHARE_NODES_PERCENT", None)
    if gpushare_nodes_percent is not None:
        env["GPUSHARE_SCALE_GPUSHARE_NODES_PERCENT"] = str(gpushare_nodes_percent)
    cp = ControlPlane(state_dir=state_dir, env=env)
    if control_plane_running(state_dir):
        raise HarnessError(
            f"a scale control plane is already running (state in {state_dir}); another bench "
            "may be using it. Stop it with: hack/kwok-cluster.sh down"
        )
    cp.script("up")
    return cp


def control_plane_running(state_dir: Path) -> bool:
    """True when a component of the harness in ``state_dir`` is alive."""
    return any(_alive(pid) for pid in ControlPlane(state_dir=state_dir).pids().values())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Controller:
    """The gpushare controller process (extender, optionally the webhook; no operator)."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def controller_available() -> bool:
    """True when this checkout has the controller's extender (``gpushare.cluster``)."""
    return (
        importlib.util.find_spec("gpushare.cluster") is not None
        and importlib.util.find_spec("gpushare.cluster.__main__") is not None
    )


async def start_controller(
    *,
    kubeconfig: Path,
    port: int,
    log_path: Path,
    extra_args: list[str],
    ready_timeout: float,
    profile_to: Path | None = None,
    source: Path | None = None,
    webhook_port: int | None = None,
    module: str = "gpushare.cluster",
) -> Controller:
    """Run ``python -m gpushare.cluster`` against the bench's API server, serving the
    extender (and, with ``webhook_port``, the admission webhook, registered with the API server
    as the chart does); returns once its /readyz answers 200 (view synced, webhook registered).
    With ``profile_to`` it runs under cProfile and writes the profile there when stopped.
    ``source`` is a directory holding a ``gpushare`` package to run instead of this checkout's
    (to try a patch on a copy). ``module``: what ``python -m`` runs, the controller itself or
    ``bench.scale.floor`` (the same controller without its placement)."""
    profiler = ["-m", "cProfile", "-o", str(profile_to)] if profile_to is not None else []
    webhook = (
        ["--no-webhook"]
        if webhook_port is None
        else [
            "--webhook-host",
            "127.0.0.1",
            "--webhook-port",
            str(webhook_port),
            "--register-webhooks",
            "--webhook-url",
            f"https://127.0.0.1:{webhook_port}",
        ]
    )
    cmd = [
        sys.executable,
        *profiler,
        "-m",
        module,
        "--kubeconfig",
        str(kubeconfig),
        "--extender-host",
        "127.0.0.1",
        "--extender-port",
        str(port),
        *webhook,
        "--no-operator",
        # The bench scrapes /metrics on loopback without a token; who may read metrics
        # decides no placement (a chart install checks tokens: docs/security.md).
        "--metrics-auth",
        "none",
        *extra_args,
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=source or REPO, start_new_session=True
        )
    ctl = Controller(proc=proc, port=port, log_path=log_path)
    deadline = time.monotonic() + ready_timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise HarnessError(
                    f"controller exited with {proc.returncode}; log: {log_path}\n"
                    + log_path.read_text()[-3000:]
                )
            try:
                async with session.get(ctl.url + "/readyz") as resp:
                    if resp.status == 200:
                        return ctl
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.5)
    ctl.stop()
    raise HarnessError(f"controller not ready after {ready_timeout}s; log: {log_path}")


def pause(pid: int) -> None:
    """SIGSTOP a component this harness started (backlog measurements)."""
    os.kill(pid, signal.SIGSTOP)


def resume(pid: int) -> None:
    os.kill(pid, signal.SIGCONT)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (None when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def memory_mib(pid: int) -> dict[str, float] | None:
    """Resident memory of a process in MiB: now (``rss``) and its peak so far (``peak``,
    VmHWM); None when it is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = {k: v for k, _, v in (line.partition(":") for line in lines)}
    out: dict[str, float] = {}
    for key, name in (("VmRSS", "rss"), ("VmHWM", "peak")):
        value = fields.get(key, "").split()
        if value and value[0].isdigit():
            out[name] = round(int(value[0]) / 1024, 1)
    return out or None


def start_sampler(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """py-spy sampling ``pid`` (100 Hz, its threads' Python stacks) into ``out`` (speedscope
    JSON) until :func:`stop_sampler`; None when py-spy is not installed. A sampler, not a
    tracer: the process runs at its own speed, unlike under cProfile."""
    spy = shutil.which("py-spy")
    if spy is None:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [spy, "record", "--pid", str(pid), "--rate", "100", "--format", "speedscope"]
    return subprocess.Popen(
        [*cmd, "--output", str(out), "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop_sampler(proc: subprocess.Popen[bytes] | None) -> None:
    """Stop a :func:`start_sampler` process; it writes its file on SIGINT."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    total = sum(parts[:8])
    return (total - idle) / CLOCK_TICKS, total / CLOCK_TICKS


@dataclass
class CpuSample:
    at: float
    per_process: dict[str, float]
    machine_busy: float
    machine_total: float


def sample_cpu(pids: Mapping[str, int]) -> CpuSample:
    per = {name: s for name, pid in pids.items() if (s := cpu_seconds(pid)) is not None}
    busy, total = machine_cpu_seconds()
    return CpuSample(time.monotonic(), per, busy, total)


def cpu_usage(before: CpuSample, after: CpuSample) -> dict[str, float]:
    """Cores used on average between two samples, per process, ours in all, and the rest of
    the machine (other tenants of a shared host)."""
    wall = max(after.at - before.at, 1e-9)
    out = {
        name: round((after.per_process[name] - before.per_process.get(name, 0.0)) / wall, 3)
        for name in after.per_process
    }
    ours = sum(out.values())
    machine = (after.machine_busy - before.machine_busy) / wall
    out["machine_busy"] = round(machine, 3)
    out["outside_bench"] = round(max(machine - ours, 0.0), 3)
    return out


def source_state() -> dict[str, object]:
    """The commit this checkout is at and whether gpushare/ differs from it (the controller
    measured is the working tree's unless --controller-source says otherwise). A copy of the
    tree sent to another machine reports GPUSHARE_SCALE_SOURCE, set by whoever copied it: its
    git metadata, if any came along, may describe another commit than the files."""
    if source := os.environ.get("GPUSHARE_SCALE_SOURCE"):
        return {"git_head": source, "gpushare_modified_in_tree": None}
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        dirty: bool | None = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--", "gpushare"],
                cwd=REPO,
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
        )
    except OSError:
        head, dirty = "", None
    return {"git_head": head or "unknown", "gpushare_modified_in_tree": dirty}


def _cpu_quota() -> float | None:
    """Cores the cgroup v2 CPU quota allows (None when unlimited or unreadable)."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else round(int(quota) / int(period), 2)


def machine_description(*, shared_host: bool = True, label: str | None = None) -> dict[str, object]:
    """What the run ran on. ``shared_host`` and ``label`` come from the person running it (the
    bench cannot tell a quiet dedicated machine from a busy shared one by itself; the
    ``outside_bench`` CPU column shows what other tenants took)."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    try:
        version = Path("/proc/version").read_text().strip()
    except OSError:
        version = "unknown"
    return {
        **({"label": label} if label else {}),
        "cpu_model": model,
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": len(os.sched_getaffinity(0)),
        "cpu_quota_cores": _cpu_quota(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "proc_version": version,
        "python": platform.python_version(),
        "load_average_at_start": [float(x) for x in load],
        "shared_host": shared_host,
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
