"""Faults during a burst of fractional pods on the local cluster: kill -9, in turn, the controller
(extender + webhook), the node agent, gpushare-scheduler, the kubelet and the kube-apiserver,
then start it again the way its supervisor would. After each: no GPU oversubscribed in compute
or memory, no device given twice by the kubelet, every pod Running with the environment its
placement promises or Pending with a scheduling reason, and all of it without manual help.

Each fault gets a burst of ``GPUSHARE_FAULT_PODS`` pods (CI: 24; the full run in
bench/faults/run_faults.py uses 200) created in chunks while the component is killed, kept down
for ``GPUSHARE_FAULT_DOWN_S`` seconds and restarted. Time to converge is measured from the
component being back until every pod is settled and every invariant holds (the rest of the
burst still arriving meanwhile), and from the last pod created. The components run
as host processes (the controller and node agent fixtures, the harness's schedulers, kubelet and
API server); see docs/reliability.md.

Destructive for everyone on the shared cluster: the module waits until no other pytest runs
before its fixtures start a controller or node agent.
Measurements go to $GPUSHARE_RELIABILITY_OUT (a JSON file), merged into
bench/results/reliability.json by bench/faults/summary.py.
"""

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.inventory import GpuInfo
from gpushare.api.names import RESOURCE_GPU_PERCENT
from gpushare.node.deviceplugin.holdings import kubelet_allocatable
from tests.faults.cluster_checks import (
    CHUNK,
    Burst,
    Pod,
    apiserver_ready,
    burst_pods,
    inventory,
    kubectl_json,
    settle,
    sigkill,
    wait_quiet,
    wait_until,
)
from tests.fixtures.controller import ControllerProcess, served_namespace
from tests.fixtures.node_agent import (
    DEVICE_PLUGIN_DIR,
    PLUGIN_SOCKET,
    POD_RESOURCES_SOCKET,
    NodeAgentProcess,
    find_agent,
)

pytestmark = pytest.mark.cluster

PODS = int(os.environ.get("GPUSHARE_FAULT_PODS", "24"))
DOWN_S = float(os.environ.get("GPUSHARE_FAULT_DOWN_S", "3"))
CONVERGE_TIMEOUT_S = float(os.environ.get("GPUSHARE_FAULT_CONVERGE_TIMEOUT_S", "240"))
KILL_MARGIN_S = 1.0
"""A pod rejected at admission and bound at most this long after the node agent's kill was
bound before it (see the test)."""
FAULTS = ("controller", "node-agent", "gpushare-scheduler", "kubelet", "kube-apiserver")
RESULTS: dict[str, Any] = {"pods_per_fault": PODS, "down_s": DOWN_S, "faults": {}}


@pytest.fixture(scope="session", autouse=True)
def quiet_cluster() -> None:
    """Before any cluster fixture starts a controller or node agent: this module kills or
    restarts shared components, so it waits until no other test run uses the cluster (the
    chart e2e, say, runs its own agent on the node)."""
    wait_quiet(timeout_s=1200)


def results_path(cluster: Any) -> Path:
    return Path(
        os.environ.get("GPUSHARE_RELIABILITY_OUT")
        or Path(cluster.state_dir) / "reliability" / f"faults-{os.getpid()}.json"
    )


@pytest.fixture(scope="module")
def record(cluster: Any) -> Iterator[dict[str, Any]]:
    yield RESULTS
    path = results_path(cluster)
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(path.read_text()) if path.exists() else {}
    previous.setdefault("faults", {}).update(RESULTS["faults"])
    previous.update({k: v for k, v in RESULTS.items() if k != "faults"})
    path.write_text(json.dumps(previous, indent=2, sort_keys=True))


@dataclass
class Rig:
    cluster: Any
    controller: ControllerProcess
    node_agent: NodeAgentProcess
    gpus: list[GpuInfo]


@pytest.fixture(scope="module")
def rig(cluster: Any, controller: ControllerProcess, node_agent: NodeAgentProcess) -> Rig:
    found = wait_until(lambda: inventory(cluster), timeout_s=60)
    assert found, "the node agent published no GPU inventory"
    return Rig(cluster, controller, node_agent, list(found))


@pytest.fixture
def namespace(cluster: Any, controller: ControllerProcess) -> Iterator[str]:
    with served_namespace(cluster, controller, "gs-fault") as name:
        yield name


def component_fault(
    name: str, *, cluster: Any, controller: ControllerProcess, node_agent: NodeAgentProcess
) -> dict[str, Any]:
    """kill -9 the component, keep it down DOWN_S, start it again; returns what was seen."""
    seen: dict[str, Any] = {}
    if name == "controller":
        controller.kill()
        time.sleep(DOWN_S)
        controller.start(timeout=120)
    elif name == "node-agent":
        found = find_agent(cluster.node_name)
        assert found is not None, "no node agent runs"
        sigkill(found[0])
        seen["stale_socket_left"] = PLUGIN_SOCKET.exists()
        time.sleep(DOWN_S)
        node_agent.start()
    elif name == "kubelet":
        registrations = node_agent.registrations()
        kubelet_sock = DEVICE_PLUGIN_DIR / "kubelet.sock"
        # A new kubelet deletes the socket and makes another: inode numbers may be reused, so
        # tell them apart by inode and change time.
        old = socket_id(kubelet_sock)
        cluster.harness("stop", "kubelet")
        time.sleep(DOWN_S)
        cluster.harness("start", "kubelet")

        def new_socket() -> float | None:
            now = socket_id(kubelet_sock)
            return time.monotonic() if now is not None and now != old else None

        appeared = wait_until(new_socket, timeout_s=60, every_s=0.02)
        registered = wait_until(
            lambda: time.monotonic() if node_agent.registrations() > registrations else None,
            timeout_s=30,
            every_s=0.05,
        )
        expected = len(node_agent.gpus()) * 100

        def kubelet_counts_all() -> float | None:
            try:
                count = kubelet_allocatable(socket_path=POD_RESOURCES_SOCKET)
            except Exception:  # the new kubelet's pod-resources socket is not up yet
                return None
            return time.monotonic() if count == expected else None

        admitting = wait_until(kubelet_counts_all, timeout_s=60, every_s=0.05)
        restored = wait_until(
            lambda: time.monotonic() if node_agent.advertised() == (expected, expected) else None,
            timeout_s=60,
            every_s=0.1,
        )
        seen["reregister_s"] = round(registered - appeared, 2) if appeared and registered else None
        # The kubelet's own count (its admission view) and the node object's, which the
        # kubelet writes on its status period (10 s by default).
        seen["kubelet_capacity_s"] = (
            round(admitting - appeared, 2) if appeared and admitting else None
        )
        seen["capacity_restored_s"] = (
            round(restored - appeared, 2) if appeared and restored else None
        )
    elif name in ("gpushare-scheduler", "kube-apiserver"):
        cluster.harness("stop", name)
        time.sleep(DOWN_S)
        cluster.harness("start", name)
        if name == "kube-apiserver":
            wait_until(lambda: apiserver_ready(cluster), timeout_s=90)
    else:
        raise AssertionError(f"unknown component {name}")
    return seen


def socket_id(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_ctime_ns


def restore(
    name: str, *, cluster: Any, controller: ControllerProcess, node_agent: NodeAgentProcess
) -> None:
    """Whatever happened in the test, leave the component running for everyone else."""
    if name == "controller":
        if controller.proc is None or controller.proc.poll() is not None:
            controller.start(timeout=120)
    elif name == "node-agent":
        if find_agent(cluster.node_name) is None:
            node_agent.start()
    else:
        cluster.harness("start", name)


def running(cluster: Any, namespace: str) -> list[Pod]:
    return [
        p
        for p in kubectl_json(cluster, "get", "pods", "-n", namespace)["items"]
        if p["status"].get("phase") == "Running"
    ]


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_during_a_burst_loses_and_double_books_nothing(
    fault: str, rig: Rig, namespace: str, record: dict[str, Any]
) -> None:
    cluster, controller, node_agent, gpus = rig.cluster, rig.controller, rig.node_agent, rig.gpus
    pods = burst_pods(cluster.busybox_image, PODS, fault.replace("kube-", "k"))
    burst = Burst(cluster, namespace, pods)
    before_agent = find_agent(cluster.node_name)
    running_before: dict[str, Any] = {}
    burst.start()
    # Kill once a third of the burst is in and scheduling is under way (for the node agent:
    # once some pods run, to see that they are left alone).
    wait_until(lambda: burst.created >= max(CHUNK, PODS // 3), timeout_s=120)
    if fault == "node-agent":
        wait_until(lambda: len(running(cluster, namespace)) >= 3, timeout_s=120, every_s=0.2)
    if fault == "node-agent":
        running_before = {
            p["metadata"]["name"]: p["status"]["containerStatuses"][0]
            for p in running(cluster, namespace)
        }
    killed = time.monotonic()
    killed_wall = time.time()
    try:
        seen = component_fault(fault, cluster=cluster, controller=controller, node_agent=node_agent)
    finally:
        restore(fault, cluster=cluster, controller=controller, node_agent=node_agent)
    back = time.monotonic()
    burst.join()
    last_pod = time.monotonic()
    settled_s, state = settle(cluster, namespace, gpus, len(pods), CONVERGE_TIMEOUT_S)
    # From the component being back; the rest of the burst is still arriving meanwhile.
    converge_s = None if settled_s is None else last_pod - back + settled_s
    violations = [*state.get("lost", []), *state.get("invariants", [])]
    # A kubelet killed while the runtime starts a container leaves that restartPolicy-Never pod
    # Failed with StartError on its container: the kubelet's doing, visible on the pod, and
    # only acceptable for the kubelet fault.
    failed_to_start = state.get("failed_to_start", [])
    if fault != "kubelet":
        violations.extend(failed_to_start)
    # A node agent killed while the kubelet waits on its Allocate (or with pods bound just before,
    # still queued for admission) makes the kubelet fail those pods for good: the kubelet's
    # doing, the window docs/reliability.md names. A pod's bind time is taken just after bind's
    # /readyz answer, before its Binding; the kill follows killed_wall by the time it takes to
    # find the agent: up to KILL_MARGIN_S after it counts as before the kill. A pod bound
    # later is a failure of the bind check or of readiness.
    rejected: dict[str, float | None] = state.get("rejected_at_admission", {})
    cut_off, late = [], []
    for text, bound in rejected.items():
        offset = None if bound is None else bound - killed_wall
        if fault == "node-agent" and offset is not None and offset <= KILL_MARGIN_S:
            cut_off.append(text)
        else:
            when = "unknown" if offset is None else f"{offset:+.1f} s"
            late.append(f"{text} [bound {when} from the fault's start]")
    violations.extend(late)
    if converge_s is None and not violations:
        violations.append(f"did not converge in {CONVERGE_TIMEOUT_S:.0f}s: {state}")
    if fault == "node-agent":
        # Pods that ran before the agent died still run, same container, never restarted.
        pods_now = {
            p["metadata"]["name"]: p
            for p in kubectl_json(cluster, "get", "pods", "-n", namespace)["items"]
        }
        untouched = [
            name
            for name, status in running_before.items()
            if name in pods_now
            and pods_now[name]["status"]["containerStatuses"][0]["containerID"]
            == status["containerID"]
            and pods_now[name]["status"]["containerStatuses"][0]["restartCount"] == 0
        ]
        seen["running_pods_untouched"] = f"{len(untouched)}/{len(running_before)}"
        seen["agent_pid_changed"] = before_agent is not None and node_agent.pid != before_agent[0]
        seen["mps_dirs_kept"] = all((node_agent.mps_root / g.uuid / "pipe").is_dir() for g in gpus)
        seen["gpus_mps_ready"] = all(g.mps_ready for g in node_agent.gpus())
        if len(untouched) != len(running_before):
            violations.append(
                f"agent restart touched running pods: {seen['running_pods_untouched']}"
            )
    node = kubectl_json(cluster, "get", "node", cluster.node_name)
    record["faults"][fault] = {
        "converge_s": round(converge_s, 1) if converge_s is not None else None,
        "after_last_pod_s": round(settled_s, 1) if settled_s is not None else None,
        "down_s": round(back - killed, 1),
        "violations": violations,
        "pods": state.get("pods"),
        "running": state.get("running"),
        "pending_with_reason": state.get("pending_with_reason"),
        "creates_refused_meanwhile": burst.refused,
        "failed_to_start": failed_to_start,
        "rejected_as_the_agent_died": cut_off,
        "allocatable_after": node["status"]["allocatable"].get(RESOURCE_GPU_PERCENT),
        **seen,
    }
    assert not violations, violations
    if fault == "kubelet":
        assert seen["reregister_s"] is not None and seen["capacity_restored_s"] is not None
        assert seen["kubelet_capacity_s"] is not None, "the kubelet never counted every slice"
