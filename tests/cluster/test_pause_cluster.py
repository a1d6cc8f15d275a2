"""Pausing a gpushare pod on the real kubelet, containerd and runc of the local cluster (cgroup
v1, cgroupfs driver; issue 65, docs/node-agent.md "Pausing a pod").

The request ``gpushare.io/pause`` is written as the controller writes it (here with the
test's admin rights: no placement policy is installed on the shared cluster). A pod placed by
gpushare runs a counter that prints the next number every 0.2 s and has an ``exec`` liveness
probe: paused, its counter stops, ``gpushare.io/paused`` appears with a ``Paused`` Event and
``kubectl gpushare get pods`` says so, and the kubelet does not restart it though the paused
time is longer than the probe's failure threshold times its period; resumed, the counter goes
on from where it stopped, 0 restarts. A paused pod whose agent was killed is kept paused by the
next agent while the request stands and thawed by it when the request went meanwhile. And why
the webhook refuses an opted-in pod with an ``httpGet`` liveness probe: the kubelet restarts
such a pod when it is paused.
"""

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.names import ANN_FRACTION, ANN_PAUSE, ANN_PAUSED
from gpushare.api.pause import PauseRequest, load_pause_state
from tests.faults.cluster_checks import sigkill
from tests.fixtures.cluster import REPO
from tests.fixtures.controller import ControllerProcess, served_namespace
from tests.fixtures.node_agent import NodeAgentProcess, find_agent, wait_until

pytestmark = pytest.mark.cluster

COUNTER = 'i=0; while true; do i=$((i+1)); echo "$i"; sleep 0.2; done'
PROBE_PERIOD_S = 2
PROBE_FAILURES = 2
PAUSED_FOR_S = 3 * PROBE_PERIOD_S * PROBE_FAILURES
"""Longer than the kubelet needs to restart a container whose probe fails (period x threshold)."""
MESSAGE = "test: a guaranteed pod needs the room"


@pytest.fixture
def namespace(cluster: Any, controller: ControllerProcess) -> Iterator[str]:
    with served_namespace(cluster, controller, "gs-pause") as name:
        yield name


def counter_pod(cluster: Any, name: str, *, probe: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {ANN_FRACTION: "0.1"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": cluster.busybox_image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", COUNTER],
                    "resources": {"requests": {"cpu": "1m", "memory": "4Mi"}},
                    "livenessProbe": {
                        **probe,
                        "periodSeconds": PROBE_PERIOD_S,
                        "failureThreshold": PROBE_FAILURES,
                        "timeoutSeconds": 1,
                    },
                }
            ],
        },
    }


EXEC_PROBE = {"exec": {"command": ["true"]}}


def get_pod(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = json.loads(
        cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json")
    )
    return pod


def restarts(pod: dict[str, Any]) -> int:
    return sum(int(c.get("restartCount", 0)) for c in pod["status"].get("containerStatuses", []))


def counted(cluster: Any, namespace: str, name: str) -> list[int]:
    """Every number the counter printed, in order (a restart would start again at 1)."""
    out = cluster.kubectl("logs", name, "-n", namespace, check=False)
    return [int(x) for x in out.split() if x.isdigit()]


def last(cluster: Any, namespace: str, name: str) -> int:
    numbers = counted(cluster, namespace, name)
    return numbers[-1] if numbers else 0


def start_counter(cluster: Any, namespace: str, name: str, probe: dict[str, Any]) -> None:
    manifest = counter_pod(cluster, name, probe=probe)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))
    wait_until(
        lambda: last(cluster, namespace, name) >= 5,
        timeout_s=120,
        what=f"pod {name} to run and count",
    )


def ask_pause(cluster: Any, namespace: str, name: str) -> PauseRequest:
    request = PauseRequest(
        reason="guaranteed-needs-room",
        message=MESSAGE,
        since=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    )
    cluster.kubectl(
        "annotate", "--overwrite", "pod", name, "-n", namespace, f"{ANN_PAUSE}={request.dump()}"
    )
    return request


def withdraw(cluster: Any, namespace: str, name: str) -> None:
    cluster.kubectl("annotate", "pod", name, "-n", namespace, f"{ANN_PAUSE}-")


def paused_record(cluster: Any, namespace: str, name: str) -> str | None:
    annotations = get_pod(cluster, namespace, name)["metadata"].get("annotations") or {}
    return annotations.get(ANN_PAUSED)


def event_messages(cluster: Any, namespace: str, name: str, reason: str) -> list[str]:
    return [e.get("message", "") for e in cluster.events(namespace, name=name, reason=reason)]


def still(cluster: Any, namespace: str, name: str, seconds: float) -> tuple[int, int]:
    """The counter's last number, then again ``seconds`` later."""
    before = last(cluster, namespace, name)
    time.sleep(seconds)
    return before, last(cluster, namespace, name)


def host_freezer_states(pod: dict[str, Any]) -> list[str]:
    """The kernel's word: freezer.state of each of the pod's containers (cgroup v1, cgroupfs
    driver, as hack/local-cluster.sh runs the kubelet)."""
    uid, qos = pod["metadata"]["uid"], pod["status"]["qosClass"].lower()
    base = Path("/sys/fs/cgroup/freezer/kubepods") / ("" if qos == "guaranteed" else qos)
    out = []
    for status in pod["status"]["containerStatuses"]:
        cid = status["containerID"].split("://", 1)[-1]
        out.append((base / f"pod{uid}" / cid / "freezer.state").read_text().strip())
    return out


def cli_get_pods(cluster: Any, namespace: str, *flags: str) -> str:
    env = {**os.environ, **cluster.env, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "gpushare.cli.main", "get", "pods", "-n", namespace, *flags],
        capture_output=True, text=True, env=env, timeout=60, check=True,
    ).stdout  # fmt: skip


def test_a_paused_pod_stops_and_goes_on_where_it_stopped_without_a_restart(
    cluster: Any, node_agent: NodeAgentProcess, namespace: str
) -> None:
    name = f"count-{uuid.uuid4().hex[:5]}"
    start_counter(cluster, namespace, name, EXEC_PROBE)

    asked = time.monotonic()
    request = ask_pause(cluster, namespace, name)
    record = wait_until(
        lambda: paused_record(cluster, namespace, name),
        timeout_s=30,
        every_s=0.1,
        what="gpushare.io/paused",
    )
    paused_after = time.monotonic() - asked
    assert load_pause_state(record).request_since == request.since
    pod = get_pod(cluster, namespace, name)
    assert set(host_freezer_states(pod)) == {"FROZEN"}
    events = wait_until(
        lambda: event_messages(cluster, namespace, name, "Paused"),
        timeout_s=30,
        what="a Paused Event",
    )
    assert MESSAGE in events[0] and "guaranteed-needs-room" in events[0]
    table = cli_get_pods(cluster, namespace, "-o", "wide")
    row = next(line.split() for line in table.splitlines() if line.startswith(name))
    assert "yes" in row and "guaranteed-needs-room" in row, table

    # Frozen for three times what an exec liveness probe needs to restart a container.
    before, after = still(cluster, namespace, name, PAUSED_FOR_S)
    assert after == before, f"the counter went on while paused: {before} -> {after}"
    assert restarts(get_pod(cluster, namespace, name)) == 0
    metrics = node_agent.metrics()
    assert metrics[f'gpushare_pods_paused{{node="{cluster.node_name}"}}'] == 1

    resumed_at = time.monotonic()
    withdraw(cluster, namespace, name)
    wait_until(
        lambda: paused_record(cluster, namespace, name) is None,
        timeout_s=30,
        every_s=0.1,
        what="gpushare.io/paused to go",
    )
    resumed_after = time.monotonic() - resumed_at
    wait_until(
        lambda: last(cluster, namespace, name) > after + 5,
        timeout_s=30,
        what="the counter to go on",
    )
    numbers = counted(cluster, namespace, name)
    assert numbers == list(range(1, len(numbers) + 1)), "the counter started again"
    assert restarts(get_pod(cluster, namespace, name)) == 0
    assert wait_until(
        lambda: event_messages(cluster, namespace, name, "Resumed"),
        timeout_s=30,
        what="a Resumed Event",
    )
    metrics = node_agent.metrics()
    node = cluster.node_name
    assert (
        metrics[f'gpushare_pod_pauses_total{{node="{node}",reason="guaranteed-needs-room"}}'] >= 1
    )
    assert metrics[f'gpushare_pod_resumes_total{{node="{node}",reason="withdrawn"}}'] >= 1
    assert metrics[f'gpushare_pod_paused_seconds_total{{node="{node}"}}'] >= PAUSED_FOR_S
    print(f"pause: in effect {paused_after:.2f} s after the request, resumed {resumed_after:.2f} s")


def test_a_new_agent_keeps_a_standing_pause_and_resumes_a_withdrawn_one(
    cluster: Any, node_agent: NodeAgentProcess, namespace: str
) -> None:
    name = f"count-{uuid.uuid4().hex[:5]}"
    start_counter(cluster, namespace, name, EXEC_PROBE)
    ask_pause(cluster, namespace, name)
    record = wait_until(
        lambda: paused_record(cluster, namespace, name), timeout_s=30, what="gpushare.io/paused"
    )

    # Killed while the pod is paused; the request stands: the next agent keeps it paused.
    found = find_agent(cluster.node_name)
    assert found is not None
    sigkill(found[0])
    node_agent.start()
    before, after = still(cluster, namespace, name, 5)
    assert after == before and paused_record(cluster, namespace, name) == record
    assert len(event_messages(cluster, namespace, name, "Paused")) == 1

    # Killed again; the request is withdrawn while no agent runs: the pod stays frozen until
    # the next agent thaws it.
    found = find_agent(cluster.node_name)
    assert found is not None
    sigkill(found[0])
    withdraw(cluster, namespace, name)
    before, after = still(cluster, namespace, name, 3)
    assert after == before, "thawed with no agent running?"
    node_agent.start()
    wait_until(
        lambda: last(cluster, namespace, name) > after + 5,
        timeout_s=60,
        what="the new agent to resume the pod",
    )
    assert paused_record(cluster, namespace, name) is None
    assert event_messages(cluster, namespace, name, "Resumed")
    assert restarts(get_pod(cluster, namespace, name)) == 0


def test_a_paused_pod_with_an_http_liveness_probe_is_restarted_by_the_kubelet(
    cluster: Any, node_agent: NodeAgentProcess, namespace: str
) -> None:
    """Why the webhook refuses an opted-in pod with an httpGet liveness probe (the pod here is
    not opted in, so it is admitted): frozen, its server answers nothing, the probe times out
    and the kubelet kills and restarts the container, its work lost."""
    name = f"http-{uuid.uuid4().hex[:5]}"
    probe = {"httpGet": {"path": "/", "port": 8080}}
    manifest = counter_pod(cluster, name, probe=probe)
    manifest["spec"]["containers"][0]["command"] = [
        "sh", "-c", f"mkdir -p /tmp/www && httpd -p 8080 -h /tmp/www && {COUNTER}",
    ]  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))
    wait_until(lambda: last(cluster, namespace, name) >= 5, timeout_s=120, what="it to count")
    time.sleep(PROBE_PERIOD_S * 2)
    assert restarts(get_pod(cluster, namespace, name)) == 0, "restarted before any pause"
    ask_pause(cluster, namespace, name)
    wait_until(
        lambda: restarts(get_pod(cluster, namespace, name)) > 0,
        timeout_s=PAUSED_FOR_S * 3,
        what="the kubelet to restart the paused container",
    )
    withdraw(cluster, namespace, name)


def test_a_paused_pod_with_a_tcp_liveness_probe_is_not_restarted(
    cluster: Any, node_agent: NodeAgentProcess, namespace: str
) -> None:
    """A tcpSocket probe of a frozen server passes: the kernel completes the handshake from the
    listening socket's backlog (so the webhook admits it in an opted-in pod)."""
    name = f"tcp-{uuid.uuid4().hex[:5]}"
    manifest = counter_pod(cluster, name, probe={"tcpSocket": {"port": 8080}})
    manifest["spec"]["containers"][0]["command"] = [
        "sh", "-c", f"mkdir -p /tmp/www && httpd -p 8080 -h /tmp/www && {COUNTER}",
    ]  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))
    wait_until(lambda: last(cluster, namespace, name) >= 5, timeout_s=120, what="it to count")
    ask_pause(cluster, namespace, name)
    wait_until(
        lambda: paused_record(cluster, namespace, name), timeout_s=30, what="gpushare.io/paused"
    )
    before, after = still(cluster, namespace, name, PAUSED_FOR_S)
    assert after == before
    assert restarts(get_pod(cluster, namespace, name)) == 0
    withdraw(cluster, namespace, name)
    wait_until(lambda: last(cluster, namespace, name) > after, timeout_s=30, what="it to go on")
    assert restarts(get_pod(cluster, namespace, name)) == 0
