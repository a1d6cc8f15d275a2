"""The DRA mode on a real GPU: the kubelet's DRA plugin in the node agent, CDI in containerd,
and annotated pods whose claims gpushare places, as a user installs it (``mode: dra``).

The same checks as the device plugin's (tests/gpu_cluster/test_gpu_cluster.py and
test_restart_faults.py), read from the claims instead of the pod annotations: the slice names
the GPU nvidia-smi lists; the webhook's claims are allocated by gpushare (not kube-scheduler),
each container gets its own claim's MPS settings, GEMM rates follow the thread caps, the memory
cap refuses an allocation over it, a latency claim keeps priority beside a batch one, and
running pods keep their GPU and rate when the node agent and the kubelet are killed, and when
the agent's pod is deleted and rolled by `helm upgrade`.
Results of a run: bench/results/gpu-cluster.md.
"""

import json
import time
from typing import Any

import pytest

from tests.gpu_cluster.checks import (
    check_latency_beside,
    check_launcher_kept,
    check_memory_cap,
    check_own_env,
    check_rates_follow_caps,
    check_rates_kept,
    gemm_window,
    kill_agent_and_kubelet,
    launcher_state,
    mean_rate,
    restarts,
    restore_agent,
    roll_agent,
)
from tests.gpu_cluster.claims import attribute, placed, slice_devices
from tests.gpu_cluster.harness import GpuCluster, Obj, agent_pod, wait_for

pytestmark = [pytest.mark.gpu_cluster]

SHARE_RUN_S = 60.0
MIN_WINDOW_S = 15.0


def check_claims_kept(
    gc: GpuCluster,
    when: str,
    where_before: dict[str, Any],
    where_after: dict[str, Any],
    after: dict[str, Obj],
) -> None:
    """Each running pod's claim is on the GPU it was on before, and its container was never
    restarted."""
    kept = {
        n: (where_after[n] == where_before[n], p["status"]["containerStatuses"][0]["restartCount"])
        for n, p in after.items()
    }
    ok = all(same and count == 0 for same, count in kept.values())
    gc.record(f"DRA: running pods {when}: (same GPU, restarts)", kept, "same, 0", ok)
    assert ok, kept


def first_env(gc: GpuCluster, name: str) -> dict[str, str]:
    return gc.logs(name)[0].get("env", {})  # type: ignore[no-any-return]


def nvidia_smi_uuids(gc: GpuCluster) -> list[str]:
    rows = (gc.out / "nvidia-smi.csv").read_text().strip().splitlines()[1:]
    return sorted(row.split(",")[1].strip() for row in rows)


def test_the_slice_names_each_gpu_nvidia_smi_lists(gc: GpuCluster) -> None:
    devices = wait_for(
        lambda: slice_devices(gc) or None, timeout_s=120, what="the node agent's ResourceSlices"
    )
    uuids = sorted(str(attribute(d, "uuid")) for d in devices.values())
    if not gc.real_gpu:
        gc.record("DRA: GPUs in the ResourceSlice", uuids, "every GPU nvidia-smi lists", None)
    gc.require_gpu()
    expected = nvidia_smi_uuids(gc)
    ok = uuids == expected
    gc.record("DRA: GPUs in the ResourceSlice", uuids, f"nvidia-smi's: {expected}", ok)
    assert uuids == expected
    capacity = {n: sorted(d.get("capacity", {})) for n, d in devices.items()}
    gc.record("DRA: consumable capacity per device", capacity, "gpuPercent and memory", None)


def test_claims_placed_by_gpushare_and_gemm_rates_follow_their_caps(gc: GpuCluster) -> None:
    """Three annotated pods (25%, 25%, 50%, limit = request) become claims the controller
    places on the one GPU; each container carries its own claim's cap and the GEMM rates
    follow the caps within 15%, as in device-plugin mode."""
    shares = {"dra-25a": "0.25", "dra-25b": "0.25", "dra-50": "0.5"}
    gc.delete_pods(*shares)
    until = time.time() + SHARE_RUN_S + 40.0
    gc.create(
        *(
            gc.cuda_pod(name, ["gemm", f"{until:.0f}"], fraction=f, limit=f)
            for name, f in shares.items()
        )
    )
    try:
        running = gc.wait_phase(list(shares), {"Running", "Succeeded"}, timeout_s=180)
        devices = slice_devices(gc)
        where = {n: placed(gc, p, devices) for n, p in running.items()}
        gc.record("DRA: claims (GPU, gpuPercent, status written by)", where, "recorded", None)
        percents = {n: w["gpuPercent"] for n, w in where.items()}
        want = {"dra-25a": "25", "dra-25b": "25", "dra-50": "50"}
        by_gpushare = all(
            w["allocated_by"] and "kube-scheduler" not in w["allocated_by"] for w in where.values()
        )
        gc.record(
            "DRA: gpuPercent consumed (25/25/50 asked), allocated by gpushare",
            {"gpuPercent": percents, "by gpushare": by_gpushare},
            "25, 25, 50; status.allocation not written by kube-scheduler",
            percents == want and by_gpushare,
        )
        assert percents == want, where
        assert by_gpushare, where
        assert len({w["gpu"] for w in where.values()}) == 1, "all on the one GPU"

        wait_for(
            lambda: all(any("t" in line for line in gc.logs(n)) for n in shares),
            timeout_s=120,
            what="every pod reporting GEMM rates",
            on_timeout=lambda: gc.describe(list(shares)),
        )
        env = {n: first_env(gc, n) for n in shares}
        threads = {n: int(float(f) * 100) for n, f in shares.items()}
        wrong = {
            n: (e.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), e.get("CUDA_VISIBLE_DEVICES"))
            for n, e in env.items()
            if e.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") != str(threads[n])
            or e.get("CUDA_VISIBLE_DEVICES") != where[n]["gpu"]
        }
        gc.record(
            "DRA: containers with another claim's MPS settings or GPU",
            len(wrong),
            "0",
            not wrong,
            str(wrong),
        )
        assert not wrong
        gc.wait_phase(list(shares), {"Succeeded"}, timeout_s=until - time.time() + 60)
        logs = {n: gc.logs(n) for n in shares}
    finally:
        (gc.out / "dra-share-logs.json").write_text(
            json.dumps({n: gc.logs(n) for n in shares}, indent=1)
        )
        gc.delete_pods(*shares)
    window = gemm_window(logs, until)
    overlap = window[1] - window[0]
    gc.record(
        "DRA: overlap of the three GEMM loops (s)",
        round(overlap, 1),
        f">= {MIN_WINDOW_S}",
        overlap >= MIN_WINDOW_S,
    )
    assert overlap >= MIN_WINDOW_S, window
    rates = {n: mean_rate(lines, window) for n, lines in logs.items()}
    gc.require_gpu()
    check_rates_follow_caps(gc, rates, threads, prefix="DRA ")


def test_allocation_over_the_claims_memory_cap_is_refused(gc: GpuCluster) -> None:
    name = "dra-mem-2g"
    gc.delete_pods(name)
    gc.create(gc.cuda_pod(name, ["alloc", "1024", "3072"], fraction="0.1", memory="2Gi"))
    try:
        gc.wait_phase([name], {"Succeeded"}, timeout_s=180)
        lines = gc.logs(name)
    finally:
        gc.delete_pods(name)
    env = lines[0].get("env", {})
    limit = env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "")
    gc.record("DRA: the claim's memory limit in the container", limit, "...=2048M", None)
    assert limit.endswith("=2048M"), env
    gc.require_gpu()
    check_memory_cap(gc, lines, prefix="DRA: ")


def test_a_latency_claim_keeps_priority_beside_a_batch_claim(gc: GpuCluster) -> None:
    lat, batch = "dra-latency", "dra-batch"
    gc.delete_pods(lat, batch)
    until = time.time() + 80
    gc.create(gc.cuda_pod(lat, ["latency", f"{until:.0f}"], fraction="0.25", gpu_class="latency"))
    try:
        gc.wait_phase([lat], {"Running"}, timeout_s=180)
        wait_for(lambda: sum("t" in x for x in gc.logs(lat)) >= 10, timeout_s=90, what="10 s alone")
        gc.create(gc.cuda_pod(batch, ["gemm", f"{until:.0f}"], fraction="0.5"))
        gc.wait_phase([lat, batch], {"Running", "Succeeded"}, timeout_s=180)
        wait_for(lambda: bool(gc.logs(batch)), timeout_s=60, what="the batch pod's first line")
        env = {n: first_env(gc, n) for n in (lat, batch)}
        got = {
            n: (e.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), e.get("CUDA_MPS_CLIENT_PRIORITY"))
            for n, e in env.items()
        }
        want = {lat: ("100", "0"), batch: ("50", "1")}
        gc.record(
            "DRA: latency / batch claims: (thread %, MPS priority)",
            got,
            "latency (100, 0), batch (50, 1)",
            got == want,
        )
        assert got == want, env
        gc.wait_phase([lat, batch], {"Succeeded"}, timeout_s=until - time.time() + 60)
        lines, batch_lines = gc.logs(lat), gc.logs(batch)
    finally:
        gc.delete_pods(lat, batch)
    gc.require_gpu()
    check_latency_beside(gc, lines, batch_lines, prefix="DRA: ")


def agent_ready_again(gc: GpuCluster, restarts_before: int) -> bool:
    """A new agent container (not the status the killed one left) is Ready."""
    pod = agent_pod(gc)
    ready = any(
        c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", [])
    )
    return restarts(gc) > restarts_before and ready


def test_running_claims_keep_gpu_and_rate_across_agent_and_kubelet_kills(gc: GpuCluster) -> None:
    """SIGKILL the node agent, then the kubelet: running pods keep their claim's GPU, cap and
    rate; a pod created afterwards is prepared from the restarted agent's checkpoint-backed
    state with its own settings."""
    running = {"dra-keep-25": "0.25", "dra-keep-50": "0.5"}
    new = "dra-after-restart"
    gc.delete_pods(*running, new)
    until = time.time() + 150
    gc.create(
        *(gc.cuda_pod(n, ["gemm", f"{until:.0f}"], fraction=f, limit=f) for n, f in running.items())
    )
    try:
        before = gc.wait_phase(list(running), {"Running"}, timeout_s=180)
        devices = slice_devices(gc)
        where_before = {n: placed(gc, p, devices)["gpu"] for n, p in before.items()}
        wait_for(
            lambda: all(sum("t" in x for x in gc.logs(n)) >= 10 for n in running),
            timeout_s=120,
            what="10 s of rates from each pod",
        )
        t_fault, t_back = kill_agent_and_kubelet(gc, lambda before: agent_ready_again(gc, before))
        gc.record(
            "DRA: agent + kubelet killed (SIGKILL): seconds until the agent was Ready again",
            round(t_back - t_fault, 1),
            "recorded",
            None,
        )
        gc.create(gc.cuda_pod(new, ["gemm", f"{until:.0f}"], fraction="0.25", limit="0.25"))
        gc.wait_phase([new], {"Running"}, timeout_s=180)
        wait_for(lambda: any("t" in x for x in gc.logs(new)), timeout_s=90, what="new pod rates")
        after = {n: gc.pod(n) for n in running}
        where_after = {n: placed(gc, p, devices)["gpu"] for n, p in after.items()}
        new_gpu = placed(gc, gc.pod(new), devices)["gpu"]
        gc.wait_phase([*running, new], {"Succeeded"}, timeout_s=until - time.time() + 60)
        logs = {n: gc.logs(n) for n in [*running, new]}
    finally:
        gc.delete_pods(*running, new)
    check_claims_kept(gc, "after the faults", where_before, where_after, after)
    check_own_env(
        gc,
        logs,
        {**{n: str(int(float(f) * 100)) for n, f in running.items()}, new: "25"},
        "DRA: pods with another claim's environment after the faults",
        f"new pod prepared with thread 25% on {new_gpu}",
    )
    gc.require_gpu()
    new_start = min(x["t"] for x in logs[new] if "t" in x)
    check_rates_kept(
        gc, logs, list(running), t_fault=t_fault, t_back=t_back, until=new_start, prefix="DRA "
    )


def test_running_claims_keep_gpu_and_rate_across_agent_pod_deletion_and_helm_upgrade(
    gc: GpuCluster,
) -> None:
    """`kubectl delete pod` of the agent, then `helm upgrade` with an agent setting (rolls the
    agent's DaemonSet; the MPS daemons' DaemonSet is OnDelete) in DRA mode: the MPS daemons'
    pod stays, running pods keep their claim's GPU, container and rate, and a pod created
    afterwards is prepared by the new agent with its own claim's settings (docs/chart.md,
    "Upgrade")."""
    running = {"dra-roll-25": "0.25", "dra-roll-50": "0.5"}
    new = "dra-after-roll"
    gc.delete_pods(*running, new)
    until = time.time() + 240
    gc.create(
        *(gc.cuda_pod(n, ["gemm", f"{until:.0f}"], fraction=f, limit=f) for n, f in running.items())
    )
    try:
        before = gc.wait_phase(list(running), {"Running"}, timeout_s=180)
        devices = slice_devices(gc)
        where_before = {n: placed(gc, p, devices)["gpu"] for n, p in before.items()}
        wait_for(
            lambda: all(sum("t" in x for x in gc.logs(n)) >= 10 for n in running),
            timeout_s=120,
            what="10 s of rates from each pod",
        )
        launcher_before = launcher_state(gc)
        assert launcher_before is not None or not gc.real_gpu, "no mps-launcher on a real GPU"
        t_fault, t_back = roll_agent(gc)
        gc.record(
            "DRA: agent pod deleted, then helm upgrade (node.logLevel): seconds until both were "
            "done",
            round(t_back - t_fault, 1),
            "recorded",
            None,
        )
        gc.create(gc.cuda_pod(new, ["gemm", f"{until:.0f}"], fraction="0.25", limit="0.25"))
        gc.wait_phase([new], {"Running"}, timeout_s=180)
        wait_for(lambda: any("t" in x for x in gc.logs(new)), timeout_s=90, what="new pod rates")
        after = {n: gc.pod(n) for n in running}
        where_after = {n: placed(gc, p, slice_devices(gc))["gpu"] for n, p in after.items()}
        new_gpu = placed(gc, gc.pod(new), slice_devices(gc))["gpu"]
        launcher_after = launcher_state(gc) if launcher_before is not None else None
        gc.wait_phase([*running, new], {"Succeeded"}, timeout_s=until - time.time() + 60)
        logs = {n: gc.logs(n) for n in [*running, new]}
    finally:
        gc.delete_pods(*running, new)
        restore_agent(gc)

    check_launcher_kept(
        gc,
        "DRA: mps-launcher across agent pod deletion + helm upgrade: same pod, restarts",
        launcher_before,
        launcher_after,
    )
    roll = "after agent pod deletion + helm upgrade"
    check_claims_kept(gc, roll, where_before, where_after, after)
    check_own_env(
        gc,
        logs,
        {**{n: str(int(float(f) * 100)) for n, f in running.items()}, new: "25"},
        f"DRA: pods with another claim's environment {roll}",
        f"new pod prepared with thread 25% on {new_gpu}",
    )
    gc.require_gpu()
    new_start = min(x["t"] for x in logs[new] if "t" in x)
    window = {"t_fault": t_fault, "t_back": t_back, "until": new_start}
    check_rates_kept(gc, logs, list(running), **window, prefix="DRA roll: ")
