"""The node agent's reaction to a fatal MPS client fault, end to end on the local cluster.

The node's GPUs are simulated, so no CUDA client can fault here; the test writes into the
simulated GPU's MPS server log the lines a real MPS server writes when one client faults (their
format is the one recorded on an H200, tests/gpu/test_mps_fault_gpu.py), naming the host PIDs of
two real pod containers. Everything after that is real: the agent resolves the PIDs to pods
through /proc, records Events on the faulting pod and on its victim, counts them in its
metrics, and after the workload's second fault beside a *different* neighbour (the MPS server's
own attribution is unreliable, so only the workload common to faults with different neighbours is
taken for the culprit) lists it in the node annotation, evicts its pod, and the ReplicaSet's
replacement goes through the webhook onto a GPU of its own. Two workloads that fault together
twice are separated instead: the younger one's replacement is kept off the GPU where they
faulted.
"""

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.exclusive import load_exclusive, load_separated, parse_avoid_gpus
from gpushare.api.names import (
    ANN_AVOID_GPUS,
    ANN_EXCLUSIVE,
    ANN_FRACTION,
    ANN_NODE_EXCLUSIVE,
    ANN_NODE_SEPARATED,
)
from gpushare.api.placement import parse_placement
from tests.faults.cluster_checks import kubectl_json, wait_quiet, wait_until
from tests.fixtures.controller import ControllerProcess, served_namespace
from tests.fixtures.node_agent import NodeAgentProcess

pytestmark = pytest.mark.cluster

NODE_CODE = Path(__file__).resolve().parents[2] / "gpushare"
FAKE_SERVER_PID = 4_000_001  # above pid_max: never a real process


@pytest.fixture(scope="session", autouse=True)
def quiet_cluster() -> None:
    """Before any cluster fixture starts a controller or node agent: this module kills or
    restarts shared components, so it waits until no other test run uses the cluster (the
    chart e2e, say, runs its own agent on the node)."""
    wait_quiet(timeout_s=1200)


def mps_line(pid: int, message: str) -> str:
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return f"[{stamp} Server {pid:>7}] {message}\n"


def fault_lines(faulter: int, victim: int) -> list[str]:
    """What the MPS server logs when client ``faulter`` hits a fatal GPU error while ``victim``
    shares the server (the block an H200 wrote, tests/faults/data/h200_mps_server.log)."""
    s = FAKE_SERVER_PID
    return [
        mps_line(s, f"Client {{PID: {faulter}, Context: 1}} encountered a fatal GPU error."),
        mps_line(s, "Server is handling a fatal GPU error."),
        mps_line(s, f"Client {{PID: {faulter}, Context ID: 1}} on device 0 to be torn down"),
        mps_line(s, f"Client {{PID: {victim}, Context ID: 1}} on device 0 to be torn down"),
        mps_line(s, f"All clients belonging to error trigging process {faulter} will be torn down"),
        mps_line(s, f"All clients belonging to error trigging process {victim} will be torn down"),
        mps_line(s, "The following devices will be reset:"),
        mps_line(s, "0"),
        mps_line(s, "The following client process have a sticky error set:"),
        mps_line(s, str(faulter)),
        mps_line(s, str(victim)),
    ]


def exit_lines(*pids: int) -> list[str]:
    """The clients a fault broke exit (their containers restart) and the server recovers."""
    return [
        *(mps_line(FAKE_SERVER_PID, f"Client process {pid} disconnected") for pid in pids),
        mps_line(FAKE_SERVER_PID, "Destroy server context on device 0 (NVIDIA H100 80GB HBM3)"),
    ]


def container_pid(pod_uid: str) -> int:
    """Host PID of the pod's main process (``sleep``), found through its cgroup."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroup = (entry / "cgroup").read_text()
            argv = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if pod_uid in cgroup.replace("_", "-") and argv.startswith(b"sleep") and b"3600" in argv:
            return int(entry.name)
    raise AssertionError(f"no sleep process of pod {pod_uid} on this host")


def mps_server_log(agent: NodeAgentProcess, pod: dict[str, Any]) -> tuple[str, Path]:
    """(the GPU the pod was placed on, that GPU's MPS server log, which the tests write to)."""
    placement = parse_placement(pod["metadata"]["annotations"])
    assert placement is not None, f"pod {pod['metadata']['name']} has no placement"
    gpu = placement.gpu_uuids[0]
    return gpu, agent.mps_root / gpu / "log" / "server.log"


def agent_is_stale(agent: NodeAgentProcess) -> bool:
    """The running agent started before the node-side code last changed."""
    started = Path(f"/proc/{agent.pid}").stat().st_ctime
    sources = [*NODE_CODE.glob("node/*.py"), *NODE_CODE.glob("api/*.py")]
    return max(p.stat().st_mtime for p in sources) > started


@pytest.fixture(scope="module")
def agent(cluster: Any, node_agent: NodeAgentProcess) -> NodeAgentProcess:
    """The shared agent, restarted once if it runs older code than this checkout (only when no
    other test run would be disturbed)."""
    if agent_is_stale(node_agent):
        wait_quiet(timeout_s=600)
        node_agent.restart()
    return node_agent


@pytest.fixture
def namespace(cluster: Any, controller: ControllerProcess) -> Iterator[str]:
    try:
        with served_namespace(cluster, controller, "gs-mpsfault") as name:
            yield name
    finally:
        cluster.kubectl(
            "annotate",
            "node",
            cluster.node_name,
            f"{ANN_NODE_EXCLUSIVE}-",
            f"{ANN_NODE_SEPARATED}-",
            check=False,
        )


def container(image: str) -> dict[str, Any]:
    return {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["sleep", "3600"],
        "resources": {"requests": {"cpu": "1m", "memory": "4Mi"}},
    }


def manifests(image: str) -> list[dict[str, Any]]:
    template = {
        "metadata": {"labels": {"app": "faulty"}, "annotations": {ANN_FRACTION: "0.25"}},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [container(image)]},
    }
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "faulty"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "faulty"}},
                "template": template,
            },
        },
        *(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "annotations": {ANN_FRACTION: "0.25"}},
                "spec": {"terminationGracePeriodSeconds": 0, "containers": [container(image)]},
            }
            for name in ("neighbour", "neighbour-2")
        ),
    ]


def deployment(name: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": {ANN_FRACTION: "0.25"}},
                "spec": {"terminationGracePeriodSeconds": 0, "containers": [container(image)]},
            },
        },
    }


def running_pods(cluster: Any, namespace: str) -> list[dict[str, Any]]:
    pods = kubectl_json(cluster, "get", "pods", "-n", namespace)["items"]
    return [
        p
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


def replacement_of(cluster: Any, namespace: str, prefix: str, old_uid: str) -> Any:
    """The pod its controller created in place of the evicted one, or None yet."""
    for pod in kubectl_json(cluster, "get", "pods", "-n", namespace)["items"]:
        if pod["metadata"]["name"].startswith(prefix) and pod["metadata"]["uid"] != old_uid:
            return pod
    return None


def where_it_went(cluster: Any, namespace: str, pod: dict[str, Any]) -> str | None:
    """ "running on <GPU> at <threads>%", "pending: <the scheduler's reason>", or None yet."""
    now = next(
        (
            p
            for p in kubectl_json(cluster, "get", "pods", "-n", namespace)["items"]
            if p["metadata"]["uid"] == pod["metadata"]["uid"]
        ),
        None,
    )
    if now is None:
        return None
    where = parse_placement(now["metadata"].get("annotations") or {})
    if where is not None and now["status"].get("phase") == "Running":
        return f"running on {where.gpu_uuids[0]} at {where.thread_percent}%"
    refused = [
        e["message"]
        for e in events(cluster, namespace, "FailedScheduling")
        if e["involvedObject"]["name"] == now["metadata"]["name"]
    ]
    return f"pending: {refused[-1]}" if refused else None


def events(cluster: Any, namespace: str, reason: str) -> list[dict[str, Any]]:
    items = kubectl_json(cluster, "get", "events", "-n", namespace)["items"]
    return [e for e in items if e.get("reason") == reason]


def test_faulting_pod_and_victim_get_events_and_a_repeat_faulter_gets_its_own_gpu(
    cluster: Any, agent: NodeAgentProcess, controller: ControllerProcess, namespace: str
) -> None:
    doc = {"apiVersion": "v1", "kind": "List", "items": manifests(cluster.busybox_image)}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    pods = wait_until(
        lambda: (r := running_pods(cluster, namespace)) and len(r) == 3 and r, timeout_s=120
    )
    assert pods, "the faulty Deployment's pod and its two neighbours never ran"
    by_name = {p["metadata"]["name"]: p for p in pods}
    faulty = next(p for n, p in by_name.items() if n.startswith("faulty-"))
    neighbour = by_name["neighbour"]
    gpu, log = mps_server_log(agent, faulty)
    faulter_pid = container_pid(faulty["metadata"]["uid"])
    victim_pid = container_pid(neighbour["metadata"]["uid"])
    second_victim_pid = container_pid(by_name["neighbour-2"]["metadata"]["uid"])

    with log.open("a") as handle:
        for pid in (victim_pid, faulter_pid):
            handle.write(
                mps_line(FAKE_SERVER_PID, f"Client {{PID: {pid}, Context ID: 0}} connected")
            )
    time.sleep(1.5)  # the agent resolves clients to pods while they are connected
    injected = time.monotonic()
    with log.open("a") as handle:
        handle.writelines(fault_lines(faulter_pid, victim_pid))
        handle.writelines(exit_lines(faulter_pid, victim_pid))
    blamed = wait_until(lambda: events(cluster, namespace, "GpuShareFault"), timeout_s=30)
    detected = time.monotonic() - injected
    assert blamed, f"no GpuShareFault event:\n{agent.log_text()[-2000:]}"
    assert {e["involvedObject"]["name"] for e in blamed} == {faulty["metadata"]["name"]}
    assert str(faulter_pid) in blamed[0]["message"] and gpu in blamed[0]["message"]
    victims = wait_until(lambda: events(cluster, namespace, "GpuShareFaultVictim"), timeout_s=10)
    assert victims and {e["involvedObject"]["name"] for e in victims} == {"neighbour"}
    assert faulty["metadata"]["name"] in victims[0]["message"]  # the victim is told who did it
    metrics = agent.metrics()
    faulting = [
        v
        for k, v in metrics.items()
        if "gpushare_mps_fault_clients_total" in k and 'role="faulting"' in k and gpu in k
    ]
    assert faulting and faulting[0] >= 1

    # One fault concludes nothing: nobody is marked yet.
    assert ANN_NODE_EXCLUSIVE not in (
        kubectl_json(cluster, "get", "node", cluster.node_name)["metadata"].get("annotations") or {}
    )
    # The same workload faults again beside another neighbour: the one workload common to both
    # faults is marked, evicted, and recreated on a whole GPU. The server names the *victim*
    # this time (as an H200 did in most trials): the verdict must not depend on it.
    with log.open("a") as handle:
        for pid in (second_victim_pid, faulter_pid):
            handle.write(
                mps_line(FAKE_SERVER_PID, f"Client {{PID: {pid}, Context ID: 0}} connected")
            )
    time.sleep(1.0)
    with log.open("a") as handle:
        handle.writelines(fault_lines(second_victim_pid, faulter_pid))
        handle.writelines(exit_lines(faulter_pid, second_victim_pid))

    marks = wait_until(lambda: load_exclusive_marks(cluster), timeout_s=30)
    rs_uid = faulty["metadata"]["ownerReferences"][0]["uid"]
    assert marks and rs_uid in {m.uid for m in marks}, marks

    new = wait_until(
        lambda: replacement_of(cluster, namespace, "faulty-", faulty["metadata"]["uid"]),
        timeout_s=60,
    )
    if new is None:
        now = kubectl_json(cluster, "get", "pods", "-n", namespace)["items"]
        pytest.fail(
            "the faulting pod was not moved:\n"
            + json.dumps([p["metadata"].get("annotations") for p in now], indent=1)
            + f"\ncontroller:\n{controller.log_tail(20)}\nagent:\n{agent.log_text()[-3000:]}"
        )
    ann = new["metadata"]["annotations"]
    assert ann[ANN_FRACTION] == "1" and "fatal GPU faults" in ann[ANN_EXCLUSIVE]
    exclusive_events = events(cluster, namespace, "GpuShareExclusiveGpu")
    assert exclusive_events and "evicting" in exclusive_events[0]["message"]

    outcome = wait_until(lambda: where_it_went(cluster, namespace, new), timeout_s=90)
    assert outcome, "the replacement was neither placed nor given a reason"
    if outcome.startswith("running"):
        everyone = kubectl_json(cluster, "get", "pods", "-A")["items"]
        where = outcome.split()[2]
        sharing = [
            p["metadata"]["name"]
            for p in everyone
            if p["metadata"]["uid"] != new["metadata"]["uid"]
            and p["status"].get("phase") not in ("Succeeded", "Failed")
            and (pl := parse_placement(p["metadata"].get("annotations") or {})) is not None
            and where in pl.gpu_uuids
        ]
        assert not sharing, f"the exclusive pod shares {where} with {sharing}"
    # The victims were never touched, nor marked.
    assert {m.uid for m in load_exclusive_marks(cluster)} == {rs_uid}
    still = {p["metadata"]["name"]: p for p in running_pods(cluster, namespace)}
    for name in ("neighbour", "neighbour-2"):
        assert name in still
        assert still[name]["status"]["containerStatuses"][0]["restartCount"] == 0
    print(f"\nfault detected and evented in {detected:.2f}s; replacement: {outcome}")


def test_a_pair_that_keeps_faulting_together_is_separated_off_the_gpu_where_it_faulted(
    cluster: Any, agent: NodeAgentProcess, controller: ControllerProcess, namespace: str
) -> None:
    def apply(doc: dict[str, Any]) -> None:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))

    def running(prefix: str) -> dict[str, Any] | None:
        return next(
            (
                p
                for p in running_pods(cluster, namespace)
                if p["metadata"]["name"].startswith(prefix)
            ),
            None,
        )

    apply(deployment("server", cluster.busybox_image))
    server = wait_until(lambda: running("server-"), timeout_s=120)
    assert server, "the server Deployment's pod never ran"
    time.sleep(1.1)  # creation timestamps have second resolution: the trainer is younger
    apply(deployment("trainer", cluster.busybox_image))
    trainer = wait_until(lambda: running("trainer-"), timeout_s=120)
    assert trainer, "the trainer Deployment's pod never ran"
    gpu, log = mps_server_log(agent, server)
    server_pid = container_pid(server["metadata"]["uid"])
    trainer_pid = container_pid(trainer["metadata"]["uid"])

    for _ in range(2):  # the same pair, twice: nothing tells which of them faults
        with log.open("a") as handle:
            for pid in (server_pid, trainer_pid):
                handle.write(
                    mps_line(FAKE_SERVER_PID, f"Client {{PID: {pid}, Context ID: 0}} connected")
                )
        time.sleep(1.5)  # the agent resolves clients to pods while they are connected
        with log.open("a") as handle:
            handle.writelines(fault_lines(server_pid, trainer_pid))
            handle.writelines(exit_lines(server_pid, trainer_pid))
        time.sleep(1.0)

    def separated() -> list[Any]:
        node = kubectl_json(cluster, "get", "node", cluster.node_name)
        text = node["metadata"].get("annotations", {}).get(ANN_NODE_SEPARATED)
        return load_separated(text) if text else []

    trainer_rs = trainer["metadata"]["ownerReferences"][0]["uid"]
    marks = wait_until(lambda: [m for m in separated() if m.uid == trainer_rs], timeout_s=30)
    assert marks, f"the trainer was not separated:\n{agent.log_text()[-3000:]}"
    assert marks[0].gpu_uuid == gpu
    assert trainer_rs not in {m.uid for m in load_exclusive_marks(cluster)}

    new = wait_until(
        lambda: replacement_of(cluster, namespace, "trainer-", trainer["metadata"]["uid"]),
        timeout_s=60,
    )
    assert new is not None, f"the trainer was not moved:\n{controller.log_tail(20)}"
    ann = new["metadata"]["annotations"]
    assert parse_avoid_gpus(ann.get(ANN_AVOID_GPUS)) == {gpu}
    assert ann[ANN_FRACTION] == "0.25" and ANN_EXCLUSIVE not in ann  # its share is unchanged

    result = wait_until(lambda: where_it_went(cluster, namespace, new), timeout_s=90)
    assert result, "the replacement was neither placed nor given a reason"
    if result.startswith("running"):
        assert gpu not in result, f"the separated trainer is back on {gpu}"
    else:
        assert f"avoids GPU {gpu}" in result, result
    # The server, the long-running one, was never touched.
    still = running("server-")
    assert still is not None and still["metadata"]["uid"] == server["metadata"]["uid"]
    print(f"\nseparated off {gpu}; replacement: {result}")


def load_exclusive_marks(cluster: Any) -> list[Any]:
    node = kubectl_json(cluster, "get", "node", cluster.node_name)
    text = node["metadata"].get("annotations", {}).get(ANN_NODE_EXCLUSIVE)
    return load_exclusive(text) if text else []
