"""Fault detection on MPS logs without a GPU or a cluster: what the node agent concludes from the
lines an MPS server writes when one client faults (gpushare.node.faults)."""

import json
import time
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.api.exclusive import ExclusiveWorkload, dump_exclusive, load_exclusive
from gpushare.api.names import ANN_GPU_UUID, ANN_THREAD_PERCENT
from gpushare.api.pod import pod_info
from gpushare.node.faults.incidents import FaultDetector
from gpushare.node.faults.monitor import FaultMonitor
from gpushare.node.faults.parsing import classify, is_fault_line, parse_log_line
from gpushare.node.faults.procfs import PodResolver
from gpushare.node.faults.tailing import LogTail
from gpushare.node.faults.verdicts import workload_of

GPU = "GPU-11111111-2222-3333-4444-555555555555"
POD_A = "0f0e0d0c-0b0a-0908-0706-050403020100"
POD_B = "1f1e1d1c-1b1a-1918-1716-151413121110"


def line(at: str, source: str, pid: int, message: str) -> str:
    return f"[2026-11-21 {at} {source} {pid:>5}] {message}"


NORMAL = [
    line("10:00:00.100", "Other", 82, "Startup"),
    line("10:00:00.150", "Server", 82, "Active Threads Percentage set to 50.0"),
    line("10:00:00.200", "Server", 82, "Server has started"),
    line(
        "10:00:00.300", "Server", 82, "Received new client request for {PID: 4267, Context ID: 0}"
    ),
    line("10:00:00.301", "Server", 82, "Client {PID: 4267, Context ID: 0} connected"),
    line("10:00:00.401", "Server", 82, "Client {PID: 4281, Context ID: 0} connected"),
]


def parsed(texts: list[str]) -> list[Any]:
    out = [parse_log_line(t) for t in texts]
    assert all(out), texts
    return out


def test_log_lines_parse_with_source_pid_and_local_time() -> None:
    first = parse_log_line("[2021-12-19 16:22:21.847 Control     1] Starting control daemon")
    assert first is not None
    assert (first.source, first.pid, first.message) == ("Control", 1, "Starting control daemon")
    assert first.at == pytest.approx(
        time.mktime(time.strptime("2021-12-19 16:22:21", "%Y-%m-%d %H:%M:%S")) + 0.847
    )
    legacy = parse_log_line("[2024-04-29 11:22:10.421 Legacy Server   425] Failed to start")
    assert legacy is not None and legacy.source == "Legacy Server"
    assert parse_log_line("Size of /dev/shm: 16594362368 bytes") is None


def test_routine_lines_are_not_faults() -> None:
    routine = [
        *NORMAL,
        line("10:00:02.000", "Server", 82, "Receive command failed, assuming client exit"),
        line("10:00:02.001", "Server", 82, "Client {PID: 4267, Context ID: 0} disconnected"),
        line("10:00:02.100", "Control", 1, "User did not send valid credentials"),
    ]
    assert not any(is_fault_line(p) for p in parsed(routine))


def test_the_client_the_server_names_is_kept_apart_from_the_others_involved() -> None:
    fault = parsed(
        [
            line(
                "10:00:01.000",
                "Server",
                82,
                "Client {PID: 4281, Context ID: 0} encountered a fatal GPU error",
            ),
            line(
                "10:00:01.001",
                "Server",
                82,
                "Notifying client {PID: 4267, Context ID: 0} of the fatal exception",
            ),
        ]
    )
    named, others = classify(fault, connected={4267, 4281, 5000})
    assert named == (4281,)  # evidence the server gives; not proof of who faulted
    assert set(others) == {4267, 5000}


def test_a_fault_naming_no_client_blames_nobody() -> None:
    fault = parsed([line("10:00:01.000", "Server", 82, "Server encountered a fatal exception")])
    faulting, victims = classify(fault, connected={4267, 4281})
    assert faulting == ()
    assert set(victims) == {4267, 4281}


def test_detector_emits_one_incident_per_fault_once_the_lines_settle() -> None:
    detector = FaultDetector(GPU, settle_s=0.3)
    connected = detector.feed(parsed(NORMAL), now=100.0)
    assert connected == [4267, 4281]  # to resolve to pods while they live
    detector.feed(
        parsed(
            [
                line(
                    "10:00:01.000",
                    "Server",
                    82,
                    "Client {PID: 4281, Context ID: 0} encountered a fatal GPU exception",
                ),
                line(
                    "10:00:01.002", "Server", 82, "Client {PID: 4267, Context ID: 0} disconnected"
                ),
            ]
        ),
        now=101.0,
    )
    assert detector.incidents(now=101.1) == []  # more lines of the same fault may follow
    (incident,) = detector.incidents(now=101.4)
    assert incident.faulting_pids == (4281,)
    assert incident.victim_pids == (4267,)  # it left after the fault: still a victim
    assert incident.server_pid == 82
    assert detector.incidents(now=105.0) == []


def test_faults_logged_before_the_agent_started_are_history() -> None:
    late_start = parse_log_line(NORMAL[-1])
    assert late_start is not None
    detector = FaultDetector(GPU, since=late_start.at + 10)
    detector.feed(
        parsed([*NORMAL, line("10:00:01.000", "Server", 82, "Client 4281 caused a fatal fault")]),
        now=0.0,
    )
    assert detector.incidents(now=100.0) == []


def test_log_tail_returns_whole_lines_and_follows_truncation(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    tail = LogTail(path)
    assert tail.read() == []  # not there yet
    path.write_text("one\ntw")
    assert tail.read() == ["one"]
    with path.open("a") as handle:
        handle.write("o\nthree\n")
    assert tail.read() == ["two", "three"]
    path.write_text("fresh\n")  # rotated/truncated: start over
    assert tail.read() == ["fresh"]


def fake_proc(root: Path, pid: int, *, pod_uid: str | None, nspid: list[int]) -> None:
    proc = root / str(pid)
    proc.mkdir(parents=True)
    cgroup = f"0::/kubepods/besteffort/pod{pod_uid}/{'a' * 64}" if pod_uid else "0::/init.scope"
    (proc / "cgroup").write_text(cgroup + "\n")
    (proc / "status").write_text(f"Name:\tpython\nNSpid:\t{' '.join(map(str, nspid))}\n")


def test_pids_resolve_to_pods_by_host_pid_or_by_the_container_pid(tmp_path: Path) -> None:
    fake_proc(tmp_path, 1, pod_uid=None, nspid=[1])
    fake_proc(tmp_path, 4281, pod_uid=POD_A, nspid=[4281, 7])
    fake_proc(tmp_path, 4300, pod_uid=POD_B, nspid=[4300, 9])
    resolver = PodResolver(proc_root=tmp_path, candidates=lambda _gpu: [4281, 4300])
    assert resolver.remember(GPU, 4281) == POD_A  # a host PID
    assert resolver.remember(GPU, 9) == POD_B  # the PID the client sees in its container
    assert resolver.remember(GPU, 1) is None  # host init, not a pod
    (tmp_path / "4281" / "cgroup").unlink()  # the faulter is gone by the time it is read
    assert resolver.remember(GPU, 4281) == POD_A


def test_two_containers_with_the_same_pid_are_not_guessed(tmp_path: Path) -> None:
    fake_proc(tmp_path, 4281, pod_uid=POD_A, nspid=[4281, 7])
    fake_proc(tmp_path, 4300, pod_uid=POD_B, nspid=[4300, 7])
    resolver = PodResolver(proc_root=tmp_path, candidates=lambda _gpu: [4281, 4300])
    assert resolver.remember(GPU, 7) is None


def pod(uid: str, name: str, *, owner: str | None = None, threads: int = 30) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "team",
        "uid": uid,
        "annotations": {ANN_GPU_UUID: GPU, ANN_THREAD_PERCENT: str(threads)},
    }
    if owner:
        meta["ownerReferences"] = [
            {"kind": "ReplicaSet", "name": "trainer-7d9", "uid": owner, "controller": True}
        ]
    return {"metadata": meta, "status": {"phase": "Running"}}


def test_workload_is_the_controller_else_the_pod() -> None:
    owned = workload_of(pod(POD_A, "trainer-7d9-x", owner="rs-uid"))
    assert (owned.uid, owned.kind, owned.name) == ("rs-uid", "ReplicaSet", "trainer-7d9")
    bare = workload_of(pod(POD_B, "solo"))
    assert (bare.uid, bare.kind, bare.name) == (POD_B, "Pod", "solo")


def write_fault(log_dir: Path, at: str, faulter: int, victim: int) -> None:
    with (log_dir / "server.log").open("a") as handle:
        for text in (
            line(at, "Server", 82, f"Client {{PID: {victim}, Context ID: 0}} connected"),
            line(at, "Server", 82, f"Client {{PID: {faulter}, Context ID: 0}} connected"),
            line(
                at,
                "Server",
                82,
                f"Client {{PID: {faulter}, Context ID: 0}} encountered a fatal GPU exception",
            ),
        ):
            handle.write(text + "\n")


POD_C = "2f2e2d2c-2b2a-2928-2726-252423222120"


def test_monitor_counts_roles_and_marks_the_workload_common_to_two_faults(
    tmp_path: Path,
) -> None:
    log_dir = tmp_path / GPU / "log"
    log_dir.mkdir(parents=True)
    pods = {
        POD_A: pod(POD_A, "trainer-7d9-x", owner="rs-uid"),
        POD_B: pod(POD_B, "neighbour"),
        POD_C: pod(POD_C, "other-neighbour"),
    }
    pid_pod = {4281: POD_A, 4267: POD_B, 5281: POD_A, 5267: POD_C}
    clock = [time.mktime(time.strptime("2026-11-21 09:00:00", "%Y-%m-%d %H:%M:%S"))]
    checked: list[str] = []
    monitor = FaultMonitor(
        node_name="n1",
        log_dirs=lambda: {GPU: log_dir},
        pods=lambda: [pod_info(p) for p in pods.values()],
        fresh_pods=None,
        kube=None,
        resolver=lambda _gpu, pid: pid_pod.get(pid),
        mps_check=lambda uuid: checked.append(uuid) or True,
        exclusive_after=2,
        clock=lambda: clock[0],
    )
    write_fault(log_dir, "10:00:01.000", 4281, 4267)
    clock[0] += 3600
    monitor.check()
    clock[0] += 1
    (incident,) = monitor.check()
    faulting, victims = monitor.refs(incident)
    assert [r.key for r in faulting] == ["team/trainer-7d9-x"]
    assert [r.key for r in victims] == ["team/neighbour"]
    assert checked == [GPU]  # the daemon was health-checked after the fault
    assert monitor.exclusive == {}  # one fault is not yet a pattern
    # The trainer faults again beside another neighbour: it is the only workload in both.
    write_fault(log_dir, "10:05:00.000", 5281, 5267)
    monitor.check()
    clock[0] += 1
    assert len(monitor.check()) == 1
    (mark,) = monitor.exclusive.values()
    assert (mark.uid, mark.kind, mark.faults, mark.gpu_uuid) == ("rs-uid", "ReplicaSet", 2, GPU)
    assert monitor.stats.clients == {(GPU, "faulting"): 2, (GPU, "victim"): 2}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for m in monitor.collector().collect()
        for s in m.samples
    }
    assert samples[("gpushare_exclusive_workloads", (("node", "n1"),))] == 1
    key = (
        "gpushare_mps_fault_clients_total",
        (("gpu_uuid", GPU), ("node", "n1"), ("role", "victim")),
    )
    assert samples[key] == 2
    assert monitor.separated == {}


def test_exclusive_annotation_round_trips_and_names_itself_when_broken() -> None:
    marks = [ExclusiveWorkload("u1", "Job", "ns", "train", 3, "2026-11-21T10:00:00Z", GPU)]
    assert load_exclusive(dump_exclusive(marks)) == marks
    assert "involved in 3 fatal GPU faults" in marks[0].reason
    for bad in ("{", json.dumps({"uid": "x"}), json.dumps([{"kind": "Job"}])):
        with pytest.raises(InvalidInputError, match=r"gpushare\.io/exclusive-workloads"):
            load_exclusive(bad)


DATA = Path(__file__).parent / "data"


def replay(step_s: float = 0.5) -> tuple[list[Any], list[Any], FaultDetector]:
    """Feed the MPS logs recorded on an H200 (tests/gpu/test_mps_fault_gpu.py: two faults, the
    second with a victim that kept its broken context) as the agent reads them, every step_s."""
    lines = sorted(
        (
            p
            for name in ("h200_mps_server.log", "h200_mps_control.log")
            for raw in (DATA / name).read_text().splitlines()
            if (p := parse_log_line(raw)) is not None
        ),
        key=lambda ln: ln.at,
    )
    detector = FaultDetector("GPU-38a0bb2b-f91a-f611-a184-71c3a4d7efba")
    incidents, recovered = [], []
    now, fed = lines[0].at, 0
    while fed < len(lines) or detector.open:
        now += step_s
        batch = [ln for ln in lines[fed:] if ln.at <= now]
        fed += len(batch)
        detector.feed(batch, now=now)
        if detector.pending:  # the monitor reads the rest of a fault settle_s later
            now += detector.settle_s
            batch = [ln for ln in lines[fed:] if ln.at <= now]
            fed += len(batch)
            detector.feed(batch, now=now)
        incidents += detector.incidents(now=now)
        recovered += detector.recovered()
        if fed == len(lines) and now > lines[-1].at + 5:
            break
    return incidents, recovered, detector


def test_real_h200_logs_name_one_client_and_involve_both_and_nothing_else() -> None:
    incidents, _, _ = replay()
    assert [(i.faulting_pids, i.victim_pids) for i in incidents] == [
        ((1455,), (1453,)),  # every client is "error trigging" in the log; 1455 is named
        ((1536,), (1535,)),  # the probe client 1519 in between was no victim
    ]
    assert all(i.server_pid == 1498 for i in incidents)
    assert all("encountered a fatal GPU error" in i.evidence[0] for i in incidents)
    # Read within one polling period and the settle time of the fault being logged.
    assert all(i.detection_s <= 0.5 + 0.2 + 0.01 for i in incidents)


def test_real_h200_logs_show_recovery_and_the_client_that_blocked_it() -> None:
    incidents, recovered, detector = replay()
    first, second = incidents
    by_fault = {r.incident.logged_at: r.recovered_at - r.incident.logged_at for r in recovered}
    # The first fault's clients both exited: the server dropped its context 0.24 s later.
    assert 0.2 < by_fault[first.logged_at] < 0.4
    # The second fault's victim kept its broken context ~24 s, until the test let it exit.
    assert 24 < by_fault[second.logged_at] < 25
    assert detector.open == []


def test_a_client_that_keeps_its_broken_context_is_flagged_and_recovery_is_timed(
    tmp_path: Path,
) -> None:
    log_dir = tmp_path / GPU / "log"
    log_dir.mkdir(parents=True)
    pods = {POD_A: pod(POD_A, "trainer-7d9-x", owner="rs-uid"), POD_B: pod(POD_B, "server")}
    pid_pod = {4281: POD_A, 4267: POD_B}
    clock = [time.mktime(time.strptime("2026-11-21 10:00:02", "%Y-%m-%d %H:%M:%S"))]
    monitor = FaultMonitor(
        node_name="n1",
        log_dirs=lambda: {GPU: log_dir},
        pods=lambda: [pod_info(p) for p in pods.values()],
        fresh_pods=None,
        kube=None,
        resolver=lambda _gpu, pid: pid_pod.get(pid),
        linger_after_s=15,
        clock=lambda: clock[0],
    )
    monitor.started = 0.0
    write_fault(log_dir, "10:00:01.000", 4281, 4267)
    with (log_dir / "server.log").open("a") as handle:
        handle.write(line("10:00:01.300", "Server", 82, "Client process 4281 disconnected") + "\n")
    monitor.check()
    clock[0] += 1
    assert len(monitor.check()) == 1
    clock[0] += 10
    monitor.check()
    assert monitor.stats.lingering == 0  # within its grace period
    clock[0] += 10
    monitor.check()
    assert monitor.stats.lingering == 1  # 4267 still holds the broken context
    assert monitor.stats.recovery_s == {}
    with (log_dir / "server.log").open("a") as handle:
        handle.write(line("10:00:31.500", "Server", 82, "Client process 4267 disconnected") + "\n")
    monitor.check()
    assert monitor.stats.recovery_s[GPU] == pytest.approx(30.5)
