"""Restart faults on the real GPU: the node agent and the kubelet are killed (SIGKILL, by PID),
and the agent's pod is deleted and rolled by `helm upgrade`, while CUDA pods run. Running pods
must keep their GPU, their share and their rate; a pod created after the restarts must be
placed and get its own settings, nobody else's.
"""

import time

import pytest

from gpushare.api.names import ANN_AGENT_READY, ANN_GPU_UUID, ANN_THREAD_PERCENT
from tests.gpu_cluster.checks import (
    check_launcher_kept,
    check_rates_kept,
    kill_agent_and_kubelet,
    launcher_state,
    restarts,
    restore_agent,
    roll_agent,
)
from tests.gpu_cluster.harness import GpuCluster, agent_pod, wait_for

pytestmark = [pytest.mark.gpu_cluster]


def agent_ready_again(gc: GpuCluster, restarts_before: int) -> bool:
    """The restarted agent (a new container, not the status the killed one left behind) is
    Ready, and the node says so (``gpushare.io/agent-ready``): the kubelet has its devices."""
    pod = agent_pod(gc)
    restarted = restarts(gc) > restarts_before
    ready = any(
        c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", [])
    )
    node = gc.kjson("get", "nodes")["items"][0]
    return restarted and ready and node["metadata"]["annotations"].get(ANN_AGENT_READY) == "true"


def test_running_pods_keep_gpu_and_share_across_agent_and_kubelet_kills(gc: GpuCluster) -> None:
    running = {"keep-25": "0.25", "keep-50": "0.5"}
    new = "after-restart-25"
    gc.delete_pods(*running, new)
    until = time.time() + 150
    gc.create(
        *(gc.cuda_pod(n, ["gemm", f"{until:.0f}"], fraction=f, limit=f) for n, f in running.items())
    )
    try:
        before_pods = gc.wait_phase(list(running), {"Running"}, timeout_s=120)
        wait_for(
            lambda: all(sum("t" in x for x in gc.logs(n)) >= 10 for n in running),
            timeout_s=90,
            what="10 s of rates from each pod",
        )
        # -- the faults: SIGKILL the node agent, then the kubelet; the kubelet comes back --
        launcher_before = launcher_state(gc)
        assert launcher_before is not None or not gc.real_gpu, "no mps-launcher on a real GPU"
        t_fault, t_back = kill_agent_and_kubelet(gc, lambda before: agent_ready_again(gc, before))
        gc.record(
            "agent + kubelet killed (SIGKILL): seconds until the agent was Ready again",
            round(t_back - t_fault, 1),
            "recorded",
            None,
        )
        # The agent is Ready (/readyz) only once the restarted kubelet has its healthy devices,
        # and until then it publishes gpushare.io/agent-ready=false so the extender holds pods
        # back: a pod bound earlier would fail the kubelet's admission ("no healthy devices").
        # A run before readiness meant that lost the pod created here (gpu-cluster.md).
        # -- a pod created after the restarts is placed and gets its own settings --------
        gc.create(gc.cuda_pod(new, ["gemm", f"{until:.0f}"], fraction="0.25", limit="0.25"))
        new_pod = gc.wait_phase([new], {"Running"}, timeout_s=120)[new]
        wait_for(lambda: any("t" in x for x in gc.logs(new)), timeout_s=90, what="new pod rates")
        after_pods = {n: gc.pod(n) for n in running}
        launcher_after = launcher_state(gc) if launcher_before is not None else None
        gc.wait_phase([*running, new], {"Succeeded"}, timeout_s=until - time.time() + 60)
        logs = {n: gc.logs(n) for n in [*running, new]}
    finally:
        gc.delete_pods(*running, new)

    # The MPS daemons run in the mps-launcher container (its own pod by default), which the
    # agent's kill left alone: same pod, no restart.
    check_launcher_kept(
        gc,
        "mps-launcher (the MPS daemons' container): same pod, restarts during the faults",
        launcher_before,
        launcher_after,
    )
    # Running pods: same GPU and cap, never restarted.
    kept = {
        n: (
            after_pods[n]["metadata"]["annotations"][ANN_GPU_UUID]
            == before_pods[n]["metadata"]["annotations"][ANN_GPU_UUID],
            after_pods[n]["metadata"]["annotations"][ANN_THREAD_PERCENT],
            after_pods[n]["status"]["containerStatuses"][0]["restartCount"],
        )
        for n in running
    }
    ok = all(same and restarts == 0 for same, _, restarts in kept.values())
    gc.record("running pods after the faults: (same GPU, thread %, restarts)", kept, "same, 0", ok)
    assert ok, kept
    # Every pod's container carries its own pod's cap (env logged at start).
    wrong = {}
    own = {n: after_pods[n]["metadata"]["annotations"][ANN_THREAD_PERCENT] for n in running}
    own[new] = new_pod["metadata"]["annotations"][ANN_THREAD_PERCENT]
    new_gpu = new_pod["metadata"]["annotations"][ANN_GPU_UUID]
    for n, lines in logs.items():
        env = lines[0].get("env", {})
        if env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") != own[n]:
            wrong[n] = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    gc.record(
        "pods with another pod's environment after the faults",
        len(wrong),
        "0",
        not wrong,
        f"new pod placed with thread {own[new]}% on {new_gpu}",
    )
    assert not wrong, wrong
    assert own[new] == "25"
    gc.require_gpu()
    # Rates: each running pod before the fault vs after everything was back (new pod
    # excluded: it adds a neighbour, so the window ends when it starts).
    new_start = min(x["t"] for x in logs[new] if "t" in x)
    check_rates_kept(gc, logs, list(running), t_fault=t_fault, t_back=t_back, until=new_start)


def test_running_pods_keep_running_across_agent_pod_deletion_and_helm_upgrade(
    gc: GpuCluster,
) -> None:
    """`kubectl delete pod` of the agent, then `helm upgrade` with an agent setting (which
    rolls the agent's DaemonSet; the MPS daemons' DaemonSet is OnDelete): the MPS daemons' pod
    stays, running pods keep GPU, share, container and rate (docs/chart.md, "Upgrade")."""
    running = {"roll-25": "0.25", "roll-50": "0.5"}
    new = "after-roll-25"
    gc.delete_pods(*running, new)
    until = time.time() + 240
    gc.create(
        *(gc.cuda_pod(n, ["gemm", f"{until:.0f}"], fraction=f, limit=f) for n, f in running.items())
    )
    try:
        before_pods = gc.wait_phase(list(running), {"Running"}, timeout_s=120)
        wait_for(
            lambda: all(sum("t" in x for x in gc.logs(n)) >= 10 for n in running),
            timeout_s=90,
            what="10 s of rates from each pod",
        )
        launcher_before = launcher_state(gc)
        assert launcher_before is not None or not gc.real_gpu, "no mps-launcher on a real GPU"
        t_fault, t_back = roll_agent(gc)
        gc.record(
            "agent pod deleted, then helm upgrade (node.logLevel): seconds until both were done",
            round(t_back - t_fault, 1),
            "recorded",
            None,
        )
        gc.create(gc.cuda_pod(new, ["gemm", f"{until:.0f}"], fraction="0.25", limit="0.25"))
        new_pod = gc.wait_phase([new], {"Running"}, timeout_s=120)[new]
        wait_for(lambda: any("t" in x for x in gc.logs(new)), timeout_s=90, what="new pod rates")
        after_pods = {n: gc.pod(n) for n in running}
        launcher_after = launcher_state(gc) if launcher_before is not None else None
        gc.wait_phase([*running, new], {"Succeeded"}, timeout_s=until - time.time() + 60)
        logs = {n: gc.logs(n) for n in [*running, new]}
    finally:
        gc.delete_pods(*running, new)
        restore_agent(gc)

    check_launcher_kept(
        gc,
        "mps-launcher across agent pod deletion + helm upgrade: same pod, restarts",
        launcher_before,
        launcher_after,
    )
    kept = {
        n: (
            after_pods[n]["metadata"]["annotations"][ANN_GPU_UUID]
            == before_pods[n]["metadata"]["annotations"][ANN_GPU_UUID],
            after_pods[n]["metadata"]["annotations"][ANN_THREAD_PERCENT],
            after_pods[n]["status"]["containerStatuses"][0]["restartCount"],
        )
        for n in running
    }
    ok = all(same and restarts == 0 for same, _, restarts in kept.values())
    gc.record(
        "running pods after agent pod deletion + helm upgrade: (same GPU, thread %, restarts)",
        kept,
        "same, 0",
        ok,
    )
    assert ok, kept
    env = logs[new][0].get("env", {})
    own = new_pod["metadata"]["annotations"][ANN_THREAD_PERCENT]
    assert env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == own == "25", (env, own)
    gc.require_gpu()
    new_start = min(x["t"] for x in logs[new] if "t" in x)
    check_rates_kept(
        gc, logs, list(running), t_fault=t_fault, t_back=t_back, until=new_start, prefix="roll: "
    )
