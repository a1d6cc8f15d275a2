"""The whole system on a real GPU: kubelet, containerd, the chart and CUDA pods sharing it.

hack/gpu-host-e2e.sh brings the cluster up on the GPU machine, installs the chart with the NVML
backend and runs these tests; elsewhere they skip, saying so. Every figure is measured from
outside the pods (their logs, the node, the exporter, ``kubectl gpushare top``) and recorded
with its target in gpu-cluster-checks.json (bench/results/gpu-cluster.md has a run).
"""

import json
import time
from pathlib import Path

import pytest

from gpushare.api.names import ANN_GPU_UUID, ANN_NODE_GPUS, ANN_THREAD_PERCENT
from tests.gpu_cluster.checks import (
    check_latency_beside,
    check_memory_cap,
    check_rates_follow_caps,
    gemm_window,
    mean_rate,
)
from tests.gpu_cluster.harness import (
    METRICS_PORT,
    TEST_NAMESPACE,
    GpuCluster,
    agent_pod,
    exporter_text,
    wait_for,
)

pytestmark = [pytest.mark.gpu_cluster]

SHARE_RUN_S = 60.0
"""How long the share pods run GEMMs; the overlap of all three must last MIN_WINDOW_S."""
MIN_WINDOW_S = 15.0


def node_name(gc: GpuCluster) -> str:
    return str(gc.kjson("get", "nodes")["items"][0]["metadata"]["name"])


def host_processes(binary: str) -> list[int]:
    """PIDs of this host's processes whose argv[0] ends with ``binary``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if argv0.endswith(binary.encode()):
                pids.append(int(entry.name))
    return pids


def series(text: str, name: str) -> dict[str, float]:
    """Per-pod values of metric ``name`` (by its pod label) in an exposition text."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, _, value = line.rpartition(" ")
            pod = labels.split('pod="', 1)[1].split('"', 1)[0] if 'pod="' in labels else ""
            out[pod] = float(value)
    return out


# ---- the node and its MPS daemons -------------------------------------------------------------


def test_node_inventory_and_one_mps_daemon_per_gpu(gc: GpuCluster) -> None:
    node = gc.kjson("get", "node", node_name(gc))
    gpus = json.loads(node["metadata"]["annotations"][ANN_NODE_GPUS])
    uuids = sorted(g["uuid"] for g in gpus)
    if not gc.real_gpu:
        gc.record("GPUs in the node inventory", uuids, "every GPU nvidia-smi lists", None)
    gc.require_gpu()
    smi = (gc.out / "nvidia-smi.csv").read_text().strip().splitlines()[1:]
    expected = sorted(row.split(",")[1].strip() for row in smi)
    gc.record("GPUs in the node inventory", uuids, f"nvidia-smi's: {expected}", uuids == expected)
    assert uuids == expected
    daemons = wait_for(
        lambda: host_processes("nvidia-cuda-mps-control") or None,
        timeout_s=60,
        what="nvidia-cuda-mps-control processes",
    )
    pipes = set()
    for pid in daemons:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        pipes |= {e for e in env if e.startswith(b"CUDA_MPS_PIPE_DIRECTORY=")}
    ok = len(daemons) == len(expected) and len(pipes) == len(expected)
    gc.record(
        "MPS control daemons (one per GPU, own pipe directory)",
        {"daemons": len(daemons), "pipe_dirs": len(pipes), "gpus": len(expected)},
        "one per GPU",
        ok,
    )
    assert ok, (daemons, pipes)


# ---- thread shares, exporter, kubectl gpushare top ------------------------------------------


def test_gemm_rates_follow_thread_shares(gc: GpuCluster) -> None:
    """Three batch pods asking 25%, 25% and 50% (limit = request, so the caps are the shares)
    run bf16 GEMMs together; while they run the exporter and `kubectl gpushare top` must name
    them, and each pod's rate must be its thread share of the total within 15%."""
    shares = {"share-25a": "0.25", "share-25b": "0.25", "share-50": "0.5"}
    gc.delete_pods(*shares)
    until = time.time() + SHARE_RUN_S + 40.0  # pod start (Python + CUDA init) inside the margin
    gc.create(
        *(
            gc.cuda_pod(name, ["gemm", f"{until:.0f}"], fraction=f, limit=f)
            for name, f in shares.items()
        )
    )
    try:
        running = gc.wait_phase(list(shares), {"Running", "Succeeded"}, timeout_s=120)
        placed = {n: p["metadata"]["annotations"] for n, p in running.items()}
        threads = {n: int(a[ANN_THREAD_PERCENT]) for n, a in placed.items()}
        want = {"share-25a": 25, "share-25b": 25, "share-50": 50}
        gc.record("thread caps placed (25/25/50 asked)", threads, "25, 25, 50", threads == want)
        assert threads == want
        assert len({a[ANN_GPU_UUID] for a in placed.values()}) == 1, "all on the one GPU"

        # Every container got its own pod's settings, nothing of a neighbour's.
        first = {n: gc.logs(n)[0].get("env", {}) for n in shares}
        wrong = {
            n: env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
            for n, env in first.items()
            if env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") != str(threads[n])
        }
        gc.record(
            "containers with another pod's MPS settings", len(wrong), "0", not wrong, str(wrong)
        )
        assert not wrong

        # While they run: the exporter's per-pod series and kubectl gpushare top name them.
        wait_for(
            lambda: all(any("t" in line for line in gc.logs(n)) for n in shares),
            timeout_s=90,
            what="every pod reporting GEMM rates",
            on_timeout=lambda: gc.describe(list(shares)),
        )
        check_exporter(gc, shares)
        check_top(gc, shares, threads)

        done = gc.wait_phase(list(shares), {"Succeeded"}, timeout_s=until - time.time() + 60)
        assert done
        logs = {n: gc.logs(n) for n in shares}
    finally:
        (gc.out / "share-logs.json").write_text(
            json.dumps({n: gc.logs(n) for n in shares}, indent=1)
        )
        gc.delete_pods(*shares)
    window = gemm_window(logs, until)
    gc.record(
        "overlap of the three GEMM loops (s)",
        round(window[1] - window[0], 1),
        f">= {MIN_WINDOW_S}",
        window[1] - window[0] >= MIN_WINDOW_S,
    )
    assert window[1] - window[0] >= MIN_WINDOW_S, window
    rates = {n: mean_rate(lines, window) for n, lines in logs.items()}
    gc.require_gpu()
    check_rates_follow_caps(gc, rates, threads)


def check_exporter(gc: GpuCluster, shares: dict[str, str]) -> None:
    def named() -> dict[str, dict[str, float]] | None:
        text = exporter_text(gc)
        got = {
            m: series(text, m)
            for m in (
                "gpushare_pod_gpu_allocated_compute_ratio",
                "gpushare_pod_gpu_memory_used_bytes",
            )
        }
        alloc = got["gpushare_pod_gpu_allocated_compute_ratio"]
        used = got["gpushare_pod_gpu_memory_used_bytes"]
        if all(n in alloc for n in shares) and (
            not gc.real_gpu or all(used.get(n, 0) > 0 for n in shares)
        ):
            return got
        return None

    got = wait_for(named, timeout_s=60, what="per-pod exporter series naming the pods")
    alloc = {n: got["gpushare_pod_gpu_allocated_compute_ratio"][n] for n in shares}
    used = {n: got["gpushare_pod_gpu_memory_used_bytes"].get(n) for n in shares}
    ok = all(abs(alloc[n] - float(f)) < 1e-6 for n, f in shares.items())
    gc.record("exporter: allocated compute ratio per pod", alloc, "0.25, 0.25, 0.5", ok)
    gc.record(
        "exporter: GPU memory used per pod (bytes, from NVML's MPS client list)",
        used,
        "> 0 for each pod" if gc.real_gpu else "(simulated: not measured)",
        all((v or 0) > 0 for v in used.values()) if gc.real_gpu else None,
    )
    assert ok, alloc


SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def _failure(gc: GpuCluster, command: tuple[str, ...]) -> str:
    """What ``kubectl command`` says when it fails (its stderr), for a timeout's message."""
    try:
        return gc.kubectl(*command)
    except AssertionError as exc:
        return str(exc)


def check_top(gc: GpuCluster, shares: dict[str, str], threads: dict[str, int]) -> None:
    """`kubectl gpushare top` run where its dependencies are (the gpushare image, in the
    controller pod, with its service account), reading the agent's live metrics as a platform
    team would: the agent's /metrics answers only callers allowed to get it, so the
    service account is bound to the chart's metrics-reader ClusterRole for the read (what
    monitoring.metricsReaders does) and its token is sent with --bearer-token-file."""
    ip = agent_pod(gc)["status"]["podIP"]
    pod = gc.kjson(
        "get", "pods", "-n", gc.release_namespace, "-l", "app.kubernetes.io/component=controller"
    )["items"][0]
    controller, account = pod["metadata"]["name"], pod["spec"]["serviceAccountName"]
    reader = next(
        r["metadata"]["name"]
        for r in gc.kjson("get", "clusterroles", "-l", "app.kubernetes.io/instance=gpushare")[
            "items"
        ]
        if r["metadata"]["name"].endswith("-metrics-reader")
    )
    binding = "gpushare-e2e-top-reader"
    gc.kubectl(
        "create", "clusterrolebinding", binding, f"--clusterrole={reader}",
        f"--serviceaccount={gc.release_namespace}:{account}",
    )  # fmt: skip
    command = (
        "exec", "-n", gc.release_namespace, controller, "--", "kubectl-gpushare", "top",
        "--metrics-url", f"http://{ip}:{METRICS_PORT}/metrics",
        "--bearer-token-file", SA_TOKEN, "-o", "json",
    )  # fmt: skip
    try:
        # The binding reaches the API server's authorizer within a moment; the agent keeps a
        # refusal 10 s (gpushare.kube.access).
        text = wait_for(
            lambda: gc.kubectl(*command, check=False).strip(),
            timeout_s=45,
            what="kubectl gpushare top to read the agent's /metrics with the bound token",
            on_timeout=lambda: _failure(gc, command),
        )
    finally:
        gc.kubectl("delete", "clusterrolebinding", binding, "--ignore-not-found", check=False)
    (gc.out / "gpushare-top.json").write_text(text)
    view = json.loads(text)
    rows = {
        p["name"]: (p["thread_percent"], g)
        for n in view["nodes"]
        for g in n["gpus"]
        for p in g["pods"]
        if p["namespace"] == TEST_NAMESPACE
    }
    listed = {n: rows[n][0] for n in shares if n in rows}
    pipes = next(iter(rows.values()))[1].get("pipes", {}) if rows else {}
    ok = listed == threads and (bool(pipes) or not gc.real_gpu)
    gc.record(
        "kubectl gpushare top: pods with thread % and live pipes",
        {"pods": listed, "pipes": {k: round(v, 3) for k, v in pipes.items()}},
        "the three pods at 25/25/50 and per-pipe readings",
        ok,
    )
    assert listed == threads, rows
    if gc.real_gpu:
        assert pipes, "no live per-pipe readings"


# ---- memory cap ---------------------------------------------------------------------------------


def test_allocation_over_the_memory_cap_is_refused(gc: GpuCluster) -> None:
    name = "mem-cap-2g"
    gc.delete_pods(name)
    gc.create(gc.cuda_pod(name, ["alloc", "1024", "3072"], fraction="0.1", memory="2Gi"))
    try:
        gc.wait_phase([name], {"Succeeded"}, timeout_s=180)
        lines = gc.logs(name)
    finally:
        gc.delete_pods(name)
    gc.require_gpu()
    check_memory_cap(gc, lines)


# ---- latency pod beside a batch pod -------------------------------------------------------------


def test_latency_pod_keeps_priority_beside_a_batch_pod(gc: GpuCluster) -> None:
    """A latency-class pod runs uncapped at MPS priority 0; a batch pod placed beside it gets
    at most half the threads at priority 1 (docs/packing.md). The latency pod's GEMM time
    beside the batch pod is compared with its time alone."""
    lat, batch = "latency", "batch-beside"
    gc.delete_pods(lat, batch)
    until = time.time() + 80
    gc.create(gc.cuda_pod(lat, ["latency", f"{until:.0f}"], fraction="0.25", gpu_class="latency"))
    try:
        gc.wait_phase([lat], {"Running"}, timeout_s=120)
        wait_for(lambda: sum("t" in x for x in gc.logs(lat)) >= 10, timeout_s=90, what="10 s alone")
        gc.create(gc.cuda_pod(batch, ["gemm", f"{until:.0f}"], fraction="0.5"))
        pods = gc.wait_phase([lat, batch], {"Running", "Succeeded"}, timeout_s=120)
        env = {n: gc.logs(n)[0].get("env", {}) for n in (lat, batch)}
        got = {
            n: (
                int(pods[n]["metadata"]["annotations"][ANN_THREAD_PERCENT]),
                env[n].get("CUDA_MPS_CLIENT_PRIORITY"),
            )
            for n in (lat, batch)
        }
        ok = got == {lat: (100, "0"), batch: (50, "1")}
        gc.record(
            "latency / batch pods: (thread %, MPS priority)",
            got,
            "latency (100, 0), batch (50, 1)",
            ok,
        )
        assert ok, got
        gc.wait_phase([lat, batch], {"Succeeded"}, timeout_s=until - time.time() + 60)
        lines, batch_lines = gc.logs(lat), gc.logs(batch)
    finally:
        gc.delete_pods(lat, batch)
    gc.require_gpu()
    check_latency_beside(gc, lines, batch_lines)
