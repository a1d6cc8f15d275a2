"""A faulting MPS client on a real GPU: its neighbour breaks, gpushare reports every client
involved, the server recovers, and the workload that keeps faulting is marked for a GPU of its
own.

Runs gpushare's MpsManager and FaultMonitor (the node agent's fault detection, polling the MPS
logs every 0.5 s as the agent does) against real CUDA clients started with the environment and
mounts Allocate returns:

- A: a victim runs GEMMs; a faulter writes to an unmapped device address. The victim's next
  GEMM fails; the monitor must report both clients as involved and the one the MPS server named
  (on driver 580 the server names the real faulter only about half the time, so which one it
  names is recorded, not asserted). Detection time = monitor reaction - fault.
- B: fresh clients (driver API only) probe the server until one runs: recovery time; the
  control daemon is checked healthy (same daemon, answering).
- C: a victim that catches the error and keeps its broken context: the server refuses new
  clients (CUDA error 807) until it exits; the monitor flags it after its grace period and
  sees the recovery once it is gone.
- D: faulter-1 (beside victim-a, in A) and faulter-2 (beside victim-b, in C) belong to one
  ReplicaSet: it is the only workload common to both faults, so it is marked exclusive and
  neither victim is.
- E: more fault pairs of unrelated pods, alternating which client starts first, only to count
  how often the server (and the kernel's Xid line) names the real faulter.

``attribution`` in the results counts, over every fault of the run, how often the MPS server
named the real faulter.

Never changes GPU settings. Skips loudly without a GPU. Writes $OUT/reliability_gpu.json and
the raw MPS logs ($OUT/mps_fault_logs.txt); ``bench/faults/summary.py`` merges the JSON into
bench/results/reliability.json under ``gpu_fault``.

    PYTHONPATH=. python3 -m pytest --noconftest -p no:cacheprovider -x -s \\
        tests/gpu/test_mps_fault_gpu.py
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.inventory import GpuInfo
from gpushare.api.pod import PodInfo, pod_info
from gpushare.node.core.answer import ContainerAllocation
from gpushare.node.faults.incidents import FaultIncident
from gpushare.node.faults.monitor import FaultMonitor
from gpushare.node.gpu.nvml import NvmlBackend
from gpushare.node.mps.manager import MpsManager
from tests.gpu.mps_helpers import CONTAINERIZED, allocate, client_env

pytestmark = pytest.mark.gpu

WORKER = Path(__file__).resolve().parents[1] / "faults" / "mps_fault_worker.py"
GIB = 2**30
POLL_S = 0.5
DETECTION_LIMIT_S = 3.0
"""Fault to incident: the server logs it within ~0.3 s, the monitor polls every 0.5 s and reads
the rest of the burst 0.2 s later; 3 s leaves room for a loaded machine."""
ATTRIBUTION_TRIALS = 4
RESULTS: dict[str, Any] = {}
TRIALS: list[dict[str, Any]] = []
"""One record per fault: the real faulter, its neighbour, whom the server named."""


def out_dir() -> Path:
    return Path(os.environ.get("OUT") or tempfile.gettempdir())


def pod(uid: str, name: str, *, owner: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "gpu-test", "uid": uid, "annotations": {}}
    if owner:
        meta["ownerReferences"] = [
            {"kind": "ReplicaSet", "name": "faulty", "uid": owner, "controller": True}
        ]
    return {"metadata": meta, "status": {"phase": "Running"}}


@dataclass
class Rig:
    gpu: GpuInfo
    mps: MpsManager
    monitor: FaultMonitor
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    pid_pod: dict[int, str] = field(default_factory=dict)
    xids: list[dict[str, Any]] = field(default_factory=list)
    daemon_pid: int | None = None
    first_fault_at: float = 0.0

    def allocation(self, threads: int) -> ContainerAllocation:
        return allocate(self.mps, [self.gpu], self.gpu.uuid, threads=threads, memory=16 * GIB)

    def start(self, threads: int, pod_uid: str | None, *args: str) -> subprocess.Popen[str]:
        allocation = self.allocation(threads)
        python = [sys.executable, str(WORKER), *args]
        command = python
        if CONTAINERIZED:
            mounts = " && ".join(
                f'mkdir -p "{m.container_path}" && mount --bind "{m.host_path}" '
                f'"{m.container_path}"'
                for m in allocation.mounts
            )
            command = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c"]
            command += [f'{mounts} && exec "$@"', "container", *python]
        proc = subprocess.Popen(
            command,
            env=client_env(allocation, self.mps),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if pod_uid is not None:
            self.pid_pod[proc.pid] = pod_uid  # exec keeps the PID: it is the client's PID
        return proc


def finish(proc: subprocess.Popen[str], timeout_s: float = 90) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        return {"no_report": True, "returncode": proc.returncode, "stderr": err[-1500:]}
    return {**json.loads(lines[-1]), "returncode": proc.returncode}


def wait_ready(barrier: Path, count: int, procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 150
    while len(list(barrier.glob("ready-*"))) < count:
        for p in procs:
            if p.poll() is not None:
                _, err = p.communicate()
                pytest.fail(f"a client died before it was ready:\n{err[-2000:]}")
        assert time.monotonic() < deadline, "clients never got ready"
        time.sleep(0.05)


def wait_incident(rig: Rig, after: int, timeout_s: float = 20) -> FaultIncident | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(rig.monitor.history) > after:
            return rig.monitor.history[after]
        time.sleep(0.05)
    return None


def probe_until_ok(rig: Rig, *, timeout_s: float) -> tuple[dict[str, Any] | None, list[Any]]:
    """Fresh clients one after the other until one runs; (first success, failures)."""
    failures: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = finish(rig.start(10, None, "probe"), timeout_s=20)
        if result.get("ok"):
            return result, failures
        failures.append({k: result.get(k) for k in ("step", "rc", "at", "stderr")})
        time.sleep(0.1)
    return None, failures


def _xid_watch(rig: Rig, stop: threading.Event) -> None:
    """Record XID events NVML reports meanwhile (for the record: which XIDs a client fault
    raises under MPS)."""
    import pynvml  # noqa: PLC0415

    try:
        events = pynvml.nvmlEventSetCreate()
        handle = pynvml.nvmlDeviceGetHandleByUUID(rig.gpu.uuid)
        pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, events)
    except pynvml.NVMLError as exc:
        rig.xids.append({"unavailable": str(exc)})
        return
    while not stop.is_set():
        try:
            data = pynvml.nvmlEventSetWait_v2(events, 300)
        except pynvml.NVMLError:
            continue
        rig.xids.append({"xid": int(data.eventData), "at": time.time()})
    pynvml.nvmlEventSetFree(events)


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    nvml = NvmlBackend()
    gpu = nvml.inventory()[0]
    import pynvml  # noqa: PLC0415

    RESULTS["device"] = {
        "model": gpu.model,
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "compute_capability": gpu.compute_capability,
    }
    root = Path(tempfile.mkdtemp(prefix="gsflt", dir="/tmp"))
    mode = "private" if CONTAINERIZED else "host"
    mps = MpsManager(root=root, simulated=False, shm_mode=mode, set_exclusive_process=False)
    if not mps.ensure([gpu.uuid])[gpu.uuid].up and mode == "private":
        mps.stop_all()
        mode = "host"
        mps = MpsManager(root=root, simulated=False, shm_mode=mode, set_exclusive_process=False)
        mps.ensure([gpu.uuid])
    RESULTS["device"]["shm_mode"] = mode
    holder: dict[str, Rig] = {}

    def pods() -> list[PodInfo]:
        return [pod_info(p) for p in holder["rig"].pods.values()]

    monitor = FaultMonitor(
        node_name="gpu-test",
        log_dirs=lambda: {gpu.uuid: mps.paths(gpu.uuid).log},
        pods=pods,
        fresh_pods=None,
        kube=None,
        resolver=lambda _uuid, pid: holder["rig"].pid_pod.get(pid),
        mps_check=lambda uuid: mps.check_one(uuid).up,
        exclusive_after=2,
        linger_after_s=3.0,
        evict_lingering_after_s=0,
    )
    rig = holder["rig"] = Rig(gpu=gpu, mps=mps, monitor=monitor)
    rig.daemon_pid = mps.status()[gpu.uuid].pid
    for uid, name, owner in (
        ("victim-a", "victim-a", None),
        ("faulter-1", "faulty-1", "rs-faulty"),
        ("victim-b", "victim-b", None),
        ("faulter-2", "faulty-2", "rs-faulty"),
    ):
        rig.pods[uid] = pod(uid, name, owner=owner)
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            monitor.check()
            stop.wait(POLL_S)

    threads = [
        threading.Thread(target=poll, daemon=True),
        threading.Thread(target=_xid_watch, args=(rig, stop), daemon=True),
    ]
    for thread in threads:
        thread.start()
    try:
        yield rig
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=5)
        logs = []
        for name in ("control.log", "server.log"):
            path = mps.paths(gpu.uuid).log / name
            if path.exists():
                logs.append(f"==== {name}\n{path.read_text(errors='replace')[-60000:]}")
        (out_dir() / "mps_fault_logs.txt").write_text("\n".join(logs))
        dmesg = subprocess.run(["dmesg"], capture_output=True, text=True, check=False)
        RESULTS["dmesg_xid"] = [
            line for line in dmesg.stdout.splitlines() if "Xid" in line or "NVRM" in line
        ][-20:] or (dmesg.stderr.strip()[:200] or "no NVRM lines")
        RESULTS["xid_events"] = rig.xids
        RESULTS["attribution"] = attribution(
            TRIALS, [line for line in dmesg.stdout.splitlines() if "Xid" in line]
        )
        RESULTS["metrics"] = {
            "incidents": {f"{k[0]}|{k[1]}": v for k, v in monitor.stats.incidents.items()},
            "clients": {f"{k[0]}|{k[1]}": v for k, v in monitor.stats.clients.items()},
            "lingering": monitor.stats.lingering,
            "recovery_s": monitor.stats.recovery_s,
        }
        RESULTS["date"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        mps.stop_all()
        nvml.close()
        (out_dir() / "reliability_gpu.json").write_text(json.dumps(RESULTS, indent=2))
        print(json.dumps(RESULTS, indent=2))
        shutil.rmtree(root, ignore_errors=True)


def attribution(trials: list[dict[str, Any]], kernel: list[str]) -> dict[str, Any]:
    """How often the MPS server (and the kernel's Xid 31 line) named the real faulter."""
    xid_pids = [
        int(m.group(1)) for line in kernel if (m := re.search(r"Xid .*?: 31, pid=(\d+)", line))
    ]
    for trial in trials:
        pair = {trial["faulter_pid"], trial["victim_pid"]}
        trial["xid_pid"] = next((p for p in xid_pids if p in pair), None)
    named = [t for t in trials if t["named"]]
    return {
        "faults": len(trials),
        "server_named_one": len(named),
        "server_named_faulter": sum(1 for t in named if t["named"] == [t["faulter_pid"]]),
        "server_named_victim": sum(1 for t in named if t["named"] == [t["victim_pid"]]),
        "xid_named_faulter": sum(1 for t in trials if t["xid_pid"] == t["faulter_pid"]),
        "xid_agrees_with_server": sum(1 for t in named if [t["xid_pid"]] == t["named"]),
        "trials": trials,
    }


def incident_record(incident: FaultIncident | None, fault_at: float) -> dict[str, Any]:
    if incident is None:
        return {"detected": False}
    return {
        "detected": True,
        "attributed": incident.attributed,
        "named_pids": list(incident.faulting_pids),
        "involved_pids": list(incident.involved_pids),
        "server_pid": incident.server_pid,
        "logged_after_fault_s": round(incident.logged_at - fault_at, 3),
        "detection_s": round(incident.detected_at - fault_at, 3),
        "evidence": list(incident.evidence),
    }


def run_fault(
    rig: Rig,
    *,
    victim_uid: str,
    faulter_uid: str,
    linger: bool,
    scenario: str,
    faulter_first: bool = False,
) -> dict[str, Any]:
    barrier = Path(tempfile.mkdtemp(prefix="gsbar", dir="/tmp"))
    seen = len(rig.monitor.history)
    if faulter_first:
        faulter = rig.start(30, faulter_uid, "fault", str(barrier))
        wait_ready(barrier, 1, [faulter])
    victim = rig.start(50, victim_uid, "victim", str(barrier), "1" if linger else "0")
    if not faulter_first:
        wait_ready(barrier, 1, [victim])
        faulter = rig.start(30, faulter_uid, "fault", str(barrier))
    wait_ready(barrier, 2, [victim, faulter])
    time.sleep(1.0)  # both clients busy on the server
    (barrier / "go").touch()
    faulted = finish(faulter)
    incident = wait_incident(rig, seen)
    TRIALS.append(
        {
            "scenario": scenario,
            "faulter_started_first": faulter_first,
            "faulter_pid": faulter.pid,
            "victim_pid": victim.pid,
            "named": list(incident.faulting_pids) if incident else None,
            "involved": sorted(incident.involved_pids) if incident else None,
        }
    )
    return {
        "barrier": barrier,
        "victim": victim,
        "faulter": faulted,
        "faulter_pid": faulter.pid,
        "victim_pid": victim.pid,
        "incident": incident,
    }


def assert_both_involved(run: dict[str, Any], incident: FaultIncident | None) -> None:
    """Both clients are involved and the server named one of them (which one is recorded)."""
    assert incident is not None, "the monitor saw no fault in the MPS logs"
    pair = {run["faulter_pid"], run["victim_pid"]}
    assert pair <= set(incident.involved_pids), incident
    assert len(incident.faulting_pids) == 1 and incident.faulting_pids[0] in pair, incident
    assert not set(incident.faulting_pids) & set(incident.victim_pids), incident


def test_faulting_client_breaks_its_neighbour_and_both_are_reported_involved(rig: Rig) -> None:
    run = run_fault(rig, victim_uid="victim-a", faulter_uid="faulter-1", linger=False, scenario="A")
    victim = finish(run["victim"])
    fault_at = run["faulter"].get("fault_at", time.time())
    incident: FaultIncident | None = run["incident"]
    RESULTS["a_neighbour_breaks"] = {
        "faulter": {k: v for k, v in run["faulter"].items() if k != "pid"},
        "victim_failed": bool(victim.get("failed")),
        "victim_error": victim.get("error"),
        "victim_failed_after_fault_s": round(victim["failed_at"] - fault_at, 3)
        if victim.get("failed")
        else None,
        "incident": incident_record(incident, fault_at),
    }
    rig.first_fault_at = fault_at
    shutil.rmtree(run["barrier"], ignore_errors=True)
    assert run["faulter"].get("rc") not in (None, 0), run["faulter"]
    assert victim.get("failed"), f"the neighbour's GEMMs did not fail: {victim}"
    assert_both_involved(run, incident)
    assert incident is not None
    assert incident.detected_at - fault_at < DETECTION_LIMIT_S, incident_record(incident, fault_at)


def test_server_takes_new_clients_again_and_the_daemon_is_healthy(rig: Rig) -> None:
    fault_at = rig.first_fault_at or time.time()
    ok, failures = probe_until_ok(rig, timeout_s=40)
    status = rig.mps.check_one(rig.gpu.uuid)
    RESULTS["b_recovery"] = {
        "recovered": ok is not None,
        "recovery_s": round(ok["at"] - fault_at, 3) if ok else None,
        "probes_refused": len(failures),
        "refusals": failures[:5],
        "daemon_up": status.up,
        "daemon_same_pid": status.pid == rig.daemon_pid,
        "daemon_restarts": status.restarts,
    }
    assert ok is not None, f"no new client ran within 40 s: {failures[:3]}"
    assert status.up and status.pid == rig.daemon_pid


def test_victim_keeping_its_broken_context_blocks_new_clients_until_it_exits(rig: Rig) -> None:
    run = run_fault(rig, victim_uid="victim-b", faulter_uid="faulter-2", linger=True, scenario="C")
    fault_at = run["faulter"].get("fault_at", time.time())
    incident: FaultIncident | None = run["incident"]
    early = finish(rig.start(10, None, "probe"), timeout_s=20)
    flagged = wait_flagged(rig, timeout_s=15)
    (run["barrier"] / "stop").touch()
    victim = finish(run["victim"])
    exited_at = time.time()
    ok, failures = probe_until_ok(rig, timeout_s=30)
    RESULTS["c_lingering_victim"] = {
        "incident": incident_record(incident, fault_at),
        "victim_failed": bool(victim.get("failed")),
        "probe_while_lingering": {k: early.get(k) for k in ("ok", "step", "rc")},
        "flagged_lingering_after_fault_s": round(flagged - fault_at, 3) if flagged else None,
        "recovered_after_victim_exit_s": round(ok["at"] - exited_at, 3) if ok else None,
        "monitor_recovery_s": rig.monitor.stats.recovery_s.get(rig.gpu.uuid),
        "refusals_after_exit": failures[:5],
    }
    shutil.rmtree(run["barrier"], ignore_errors=True)
    assert_both_involved(run, incident)
    assert not early.get("ok") and early.get("rc") == 807, early  # cudaErrorMpsServerNotReady
    assert flagged, "the monitor did not flag the client that kept its broken context"
    assert ok is not None, f"no new client ran after the victim exited: {failures[:3]}"


def wait_flagged(rig: Rig, *, timeout_s: float) -> float | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if rig.monitor.stats.lingering:
            return time.time()
        time.sleep(0.1)
    return None


def test_workload_common_to_two_faults_is_marked_for_a_gpu_of_its_own(rig: Rig) -> None:
    marks = rig.monitor.exclusive
    RESULTS["d_exclusive"] = {uid: mark.reason for uid, mark in marks.items()}
    RESULTS["d_separated"] = dict(rig.monitor.separated)
    assert "victim-a" not in marks and "victim-b" not in marks, marks
    assert set(marks) == {"rs-faulty"}, marks
    assert marks["rs-faulty"].faults == 2
    assert rig.monitor.separated == {}


def test_how_often_the_server_names_the_real_faulter(rig: Rig) -> None:
    """Not a property of gpushare: a count for the record (and for the docs' claim)."""
    for k in range(ATTRIBUTION_TRIALS):
        for uid in (f"trial-{k}-f", f"trial-{k}-v"):
            rig.pods[uid] = pod(uid, uid)
        run = run_fault(
            rig,
            victim_uid=f"trial-{k}-v",
            faulter_uid=f"trial-{k}-f",
            linger=False,
            scenario="E",
            faulter_first=k % 2 == 0,
        )
        finish(run["victim"])
        shutil.rmtree(run["barrier"], ignore_errors=True)
        assert_both_involved(run, run["incident"])
        ok, failures = probe_until_ok(rig, timeout_s=30)
        assert ok is not None, f"the server did not recover after trial {k}: {failures[:3]}"
    assert set(rig.monitor.exclusive) == {"rs-faulty"}  # one fault each: nobody new marked
