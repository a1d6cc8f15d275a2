"""Who keeps breaking a shared GPU, concluded from which workloads each fault involved, not from
the client the MPS server names (on an H200 with driver 580 the named client was the real
faulter only about half the time): gpushare.node.faults.verdicts.RepeatOffenders and the monitor's
reaction, without a GPU or a cluster."""

import time
from pathlib import Path
from typing import Any

from gpushare.api.names import (
    ANN_BIND_TIME,
    ANN_GPU_UUID,
    ANN_REQUEST_PERCENT,
    ANN_STATE,
    ANN_THREAD_PERCENT,
)
from gpushare.api.pod import pod_info
from gpushare.node.faults.monitor import FaultMonitor
from gpushare.node.faults.verdicts import UNKNOWN_WORKLOAD, RepeatOffenders, pick_to_separate

HOUR = 3600.0
GPU = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


def offenders(threshold: int = 2) -> RepeatOffenders:
    return RepeatOffenders(threshold=threshold, window_s=HOUR)


def test_a_single_fault_concludes_nothing() -> None:
    verdict = offenders().record({"faulter", "victim"}, at=0.0)
    assert dict(verdict.culprits) == {}
    assert verdict.together == ()


def test_the_workload_faulting_beside_two_different_neighbours_is_the_culprit() -> None:
    rule = offenders()
    rule.record({"faulter", "victim-a"}, at=0.0)
    verdict = rule.record({"faulter", "victim-b"}, at=60.0)
    assert dict(verdict.culprits) == {"faulter": 2}  # victims each shared one fault with it
    assert verdict.together == ()


def test_the_same_pair_faulting_twice_is_separated_and_nobody_is_a_culprit() -> None:
    rule = offenders()
    rule.record({"trainer", "server"}, at=0.0)
    verdict = rule.record({"trainer", "server"}, at=60.0)
    assert dict(verdict.culprits) == {}
    assert verdict.together == ("server", "trainer")


def test_after_the_pair_is_separated_the_next_fault_tells_who_faults() -> None:
    rule = offenders()
    rule.record({"trainer", "server"}, at=0.0)
    rule.record({"trainer", "server"}, at=60.0)
    # The trainer was moved; it faults again beside someone else: it is the common factor.
    verdict = rule.record({"trainer", "notebook"}, at=120.0)
    assert dict(verdict.culprits) == {"trainer": 3}


def test_an_explained_fault_does_not_implicate_its_victim_later() -> None:
    rule = offenders()
    rule.record({"faulter", "long-runner"}, at=0.0)
    assert set(rule.record({"faulter", "other"}, at=10.0).culprits) == {"faulter"}
    # A different faulter breaks the long-runner: it shares only this fault with it now.
    verdict = rule.record({"long-runner", "new-faulter"}, at=20.0)
    assert dict(verdict.culprits) == {}
    assert verdict.together == ()


def test_faults_older_than_the_window_are_forgotten() -> None:
    rule = offenders()
    rule.record({"faulter", "victim-a"}, at=0.0)
    verdict = rule.record({"faulter", "victim-b"}, at=HOUR + 1)
    assert dict(verdict.culprits) == {}


def test_a_client_without_a_pod_in_every_fault_clears_no_one() -> None:
    rule = offenders()
    rule.record({"trainer", UNKNOWN_WORKLOAD}, at=0.0)
    verdict = rule.record({"trainer", "server", UNKNOWN_WORKLOAD}, at=10.0)
    assert dict(verdict.culprits) == {}  # the unknown client may be the same one both times
    assert verdict.together == ("trainer",)


def test_a_threshold_of_zero_turns_the_rule_off() -> None:
    rule = offenders(threshold=0)
    rule.record({"faulter", "a"}, at=0.0)
    assert rule.record({"faulter", "b"}, at=1.0).culprits == {}


def manifest(
    uid: str,
    name: str,
    created: str,
    *,
    owner: str | None = None,
    threads: int = 30,
    request: int | None = None,
) -> dict[str, Any]:
    annotations = {ANN_GPU_UUID: GPU, ANN_THREAD_PERCENT: str(threads)}
    if request is not None:  # a whole placement, as the extender writes it
        annotations |= {
            ANN_REQUEST_PERCENT: str(request),
            ANN_BIND_TIME: created,
            ANN_STATE: "allocated",
        }
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "team",
        "uid": uid,
        "creationTimestamp": created,
        "annotations": annotations,
    }
    if owner:
        meta["ownerReferences"] = [
            {"kind": "ReplicaSet", "name": f"{name}-rs", "uid": owner, "controller": True}
        ]
    return {"metadata": meta, "status": {"phase": "Running"}}


def test_the_pod_moved_apart_is_the_youngest_with_a_controller() -> None:
    old_owned = manifest("p1", "old-job", "2026-11-20T08:00:00Z", owner="rs-1")
    young_owned = manifest("p2", "young-job", "2026-11-21T08:00:00Z", owner="rs-2")
    young_bare = manifest("p3", "notebook", "2026-11-21T09:00:00Z")
    assert pick_to_separate([old_owned, young_bare, young_owned]) is young_owned
    assert pick_to_separate([old_owned, young_bare]) is old_owned  # a bare pod would be lost
    assert pick_to_separate([young_bare]) is None


def line(at: str, pid: int, message: str) -> str:
    return f"[2026-11-21 {at} Server    82] {message}\n"


def write_fault(log_dir: Path, at: str, named: int, other: int) -> None:
    """The block an H200 (driver 580) wrote for a fault: every client torn down, one named."""
    with (log_dir / "server.log").open("a") as handle:
        for pid in (named, other):
            handle.write(line(at, 82, f"Client {{PID: {pid}, Context ID: 0}} connected"))
        handle.write(
            line(at, 82, f"Client {{PID: {named}, Context: 1}} encountered a fatal GPU error.")
        )
        handle.write(line(at, 82, "Server is handling a fatal GPU error."))
        for pid in (named, other):
            handle.write(
                line(at, 82, f"Client {{PID: {pid}, Context ID: 1}} on device 0 to be torn down")
            )
        handle.write(line(at, 82, "The following client process have a sticky error set:"))
        for pid in (named, other):
            handle.write(line(at, 82, str(pid)))


def monitor_on(
    tmp_path: Path, pods: dict[str, dict[str, Any]], pid_pod: dict[int, str]
) -> tuple[FaultMonitor, Path, list[float]]:
    log_dir = tmp_path / GPU / "log"
    log_dir.mkdir(parents=True)
    clock = [time.mktime(time.strptime("2026-11-21 11:00:00", "%Y-%m-%d %H:%M:%S"))]
    monitor = FaultMonitor(
        node_name="n1",
        log_dirs=lambda: {GPU: log_dir},
        pods=lambda: [pod_info(p) for p in pods.values()],
        fresh_pods=None,
        kube=None,
        resolver=lambda _gpu, pid: pid_pod.get(pid),
        exclusive_after=2,
        clock=lambda: clock[0],
        settle_s=0.0,
    )
    monitor.started = 0.0
    return monitor, log_dir, clock


def fault(monitor: FaultMonitor, log_dir: Path, clock: list[float], *args: Any) -> None:
    write_fault(log_dir, *args)
    clock[0] += 1
    monitor.check()
    clock[0] += 1
    monitor.check()


def test_the_faulter_is_marked_even_when_the_server_names_its_victims(tmp_path: Path) -> None:
    pods = {
        "f1": manifest("f1", "faulty-1", "2026-11-21T10:00:00Z", owner="rs-faulty"),
        "va": manifest("va", "victim-a", "2026-11-21T09:00:00Z"),
        "vb": manifest("vb", "victim-b", "2026-11-21T09:00:00Z"),
    }
    pid_pod = {101: "f1", 102: "va", 201: "f1", 202: "vb"}
    monitor, log_dir, clock = monitor_on(tmp_path, pods, pid_pod)
    fault(monitor, log_dir, clock, "11:00:05.000", 102, 101)  # the server names victim-a
    fault(monitor, log_dir, clock, "11:00:30.000", 202, 201)  # and then victim-b
    assert [i.faulting_pids for i in monitor.history] == [(102,), (202,)]
    assert set(monitor.exclusive) == {"rs-faulty"}  # the ReplicaSet, neither victim
    assert monitor.exclusive["rs-faulty"].faults == 2
    assert monitor.separated == {}


def test_a_pair_that_faults_twice_has_its_younger_controlled_pod_moved_not_marked(
    tmp_path: Path,
) -> None:
    pods = {
        "srv": manifest("srv", "server", "2026-11-20T09:00:00Z", owner="rs-server"),
        "trn": manifest("trn", "trainer", "2026-11-21T10:30:00Z", owner="rs-trainer"),
    }
    pid_pod = {301: "srv", 302: "trn", 401: "srv", 402: "trn"}
    monitor, log_dir, clock = monitor_on(tmp_path, pods, pid_pod)
    fault(monitor, log_dir, clock, "11:00:05.000", 301, 302)
    assert monitor.separated == {}  # one fault: nothing yet
    fault(monitor, log_dir, clock, "11:00:30.000", 401, 402)
    assert monitor.exclusive == {}  # nobody's guilt follows from the same pair twice
    assert list(monitor.separated) == ["trn"]  # the younger pod is recreated elsewhere
    assert "ReplicaSet team/server-rs" in monitor.separated["trn"]
    # Its workload is listed for the webhook, with the GPU its new pods must keep off.
    assert list(monitor.apart) == ["rs-trainer"]
    assert monitor.apart["rs-trainer"].gpu_uuid == GPU
    assert monitor.apart["rs-trainer"].faults == 2


def test_burstable_pods_that_fault_together_are_separated_like_any_share(
    tmp_path: Path,
) -> None:
    """A batch pod's thread cap may be the whole GPU (no limit set) while it asked for a
    share: its request, not its cap, says it shares the GPU."""
    pods = {
        "srv": manifest(
            "srv", "server", "2026-11-20T09:00:00Z", owner="rs-server", threads=100, request=25
        ),
        "trn": manifest(
            "trn", "trainer", "2026-11-21T10:30:00Z", owner="rs-trainer", threads=100, request=25
        ),
    }
    pid_pod = {301: "srv", 302: "trn", 401: "srv", 402: "trn"}
    monitor, log_dir, clock = monitor_on(tmp_path, pods, pid_pod)
    fault(monitor, log_dir, clock, "11:00:05.000", 301, 302)
    fault(monitor, log_dir, clock, "11:00:30.000", 401, 402)
    assert list(monitor.separated) == ["trn"]


def test_a_pod_naming_another_namespaces_workload_uid_shares_none_of_its_faults(
    tmp_path: Path,
) -> None:
    """#45: the API server checks no ownerReference UID. A tenant pod of namespace "evil"
    naming the victim's ReplicaSet UID faults beside one neighbour, the victim's own pod once
    beside another: two workloads with one fault each, nobody marked (grouped by UID alone,
    "rs-victim" was in two faults with different partners: the victim marked and evicted)."""
    pods = {
        "imp": manifest("imp", "impostor", "2026-11-21T10:00:00Z", owner="rs-victim"),
        "vic": manifest("vic", "victim", "2026-11-21T09:00:00Z", owner="rs-victim"),
        "na": manifest("na", "neighbour-a", "2026-11-21T09:00:00Z"),
        "nb": manifest("nb", "neighbour-b", "2026-11-21T09:00:00Z"),
    }
    pods["imp"]["metadata"]["namespace"] = "evil"
    pid_pod = {101: "imp", 102: "na", 201: "vic", 202: "nb"}
    monitor, log_dir, clock = monitor_on(tmp_path, pods, pid_pod)
    fault(monitor, log_dir, clock, "11:00:05.000", 101, 102)
    fault(monitor, log_dir, clock, "11:00:30.000", 201, 202)
    assert monitor.exclusive == {}
    assert monitor.separated == {}
