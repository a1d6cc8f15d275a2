"""Pausing an opportunistic GEMM on a real GPU, through the chart (issue 65; docs/node-agent.md,
"Pausing a pod"): the node agent freezes the pod's containers when ``gpushare.io/pause`` is
written (here by the test, as the controller's service account: the chart's placement policy
refuses it from anyone else; the controller's own decision to pause is tested on the local
cluster, tests/cluster/test_operator_cluster.py), and thaws them when it goes.

A guaranteed GEMM pod and an opted-in GEMM pod with an ``exec`` liveness probe share one GPU.
Measured and recorded: the guaranteed pod's rate alone, beside its running neighbour, and while
the neighbour is paused (target >= 0.95 of alone: a paused MPS client gives its SMs back); the
paused pod's rate while paused (none); how long the freeze and the thaw took from the request;
and that the paused pod finishes with the result it computed before the pause, 0 restarts.

Run on a GPU host: ``hack/gpu-host-e2e.sh --bundle DIR -- -k pause`` (docs/gpu-cluster.md).
"""

import statistics
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from gpushare.api.names import ANN_AVOID_GPUS, ANN_OPPORTUNISTIC, ANN_PAUSE, ANN_PAUSED
from gpushare.api.pause import PauseRequest
from tests.gpu_cluster.harness import TEST_NAMESPACE, GpuCluster, Obj, node_gpus, wait_for

pytestmark = [pytest.mark.gpu_cluster]

SOLO_S = 8.0
SHARED_S = 8.0
PAUSED_S = 12.0
AFTER_S = 15.0
KEPT = 0.95
"""The guaranteed pod's rate while its neighbour is paused, at least this share of alone."""


def rates(lines: list[Obj], start: float, end: float) -> list[float]:
    return [float(x["tflops"]) for x in lines if "t" in x and start <= float(x["t"]) <= end]


def mean(values: list[float]) -> float:
    return statistics.mean(values) if values else 0.0


def annotations(gc: GpuCluster, name: str) -> dict[str, str]:
    return dict(gc.pod(name)["metadata"].get("annotations") or {})


def as_controller(gc: GpuCluster) -> str:
    """kubectl's flag to act as the controller's service account: the chart's placement policy
    refuses ``gpushare.io/pause`` from anyone else (a tenant must not pause a neighbour)."""
    pod = gc.kjson(
        "get", "pods", "-n", gc.release_namespace, "-l", "app.kubernetes.io/component=controller"
    )["items"][0]
    return f"--as=system:serviceaccount:{gc.release_namespace}:{pod['spec']['serviceAccountName']}"


def test_an_opportunistic_gemm_paused_and_resumed_gives_its_result_with_0_restarts(
    gc: GpuCluster,
) -> None:
    gpus = node_gpus(gc)
    others = ",".join(gpus[1:])  # both pods on the first GPU
    guaranteed, opportunistic = "pause-guaranteed", "pause-opportunistic"
    start = time.time() + 20
    until = start + SOLO_S + SHARED_S + PAUSED_S + AFTER_S + 40
    g = gc.cuda_pod(guaranteed, ["gemm", f"{until:.0f}"], fraction="0.5")
    o = gc.cuda_pod(opportunistic, ["checked", f"{until:.0f}"], fraction="0.5")
    o["metadata"]["annotations"][ANN_OPPORTUNISTIC] = "true"
    o["spec"]["containers"][0]["livenessProbe"] = {
        "exec": {"command": [gc.python, "-c", "0"]},
        "periodSeconds": 2,
        "failureThreshold": 2,
        "timeoutSeconds": 5,
    }
    for pod in (g, o):
        if others:
            pod["metadata"]["annotations"][ANN_AVOID_GPUS] = others
    gc.delete_pods(guaranteed, opportunistic)
    try:
        gc.create(g)
        gc.wait_phase([guaranteed], {"Running"}, timeout_s=120)
        wait_for(lambda: len(rates(gc.logs(guaranteed), 0, 1e12)) >= 3, timeout_s=90,
                 what="the guaranteed pod's rates")  # fmt: skip
        solo_from = time.time()
        time.sleep(SOLO_S)
        solo_to = time.time()
        gc.create(o)
        gc.wait_phase([opportunistic], {"Running"}, timeout_s=120)
        wait_for(lambda: len(rates(gc.logs(opportunistic), 0, 1e12)) >= 3, timeout_s=90,
                 what="the opportunistic pod's rates")  # fmt: skip
        shared_from = time.time()
        time.sleep(SHARED_S)
        shared_to = time.time()

        asked = time.time()
        request = PauseRequest(
            reason="guaranteed-needs-room",
            message=f"{TEST_NAMESPACE}/{guaranteed} needs the GPU (gpu_cluster test)",
            since=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        )
        controller = as_controller(gc)
        gc.kubectl(controller, "annotate", "--overwrite", "pod", "-n", TEST_NAMESPACE,
                   opportunistic, f"{ANN_PAUSE}={request.dump()}")  # fmt: skip
        wait_for(lambda: ANN_PAUSED in annotations(gc, opportunistic), timeout_s=30,
                 what="gpushare.io/paused")  # fmt: skip
        paused_at = time.time()
        time.sleep(PAUSED_S)
        paused_to = time.time()
        withdrawn = time.time()
        gc.kubectl(controller, "annotate", "pod", "-n", TEST_NAMESPACE, opportunistic,
                   f"{ANN_PAUSE}-")  # fmt: skip
        wait_for(lambda: ANN_PAUSED not in annotations(gc, opportunistic), timeout_s=30,
                 what="gpushare.io/paused to go")  # fmt: skip
        thawed_at = time.time()
        ended = gc.wait_phase([guaranteed, opportunistic], {"Succeeded", "Failed"},
                              timeout_s=until - time.time() + 120)  # fmt: skip
        g_lines, o_lines = gc.logs(guaranteed), gc.logs(opportunistic)
    finally:
        gc.delete_pods(guaranteed, opportunistic)

    solo = mean(rates(g_lines, solo_from, solo_to))
    shared = mean(rates(g_lines, shared_from + 1, shared_to))
    beside_paused = mean(rates(g_lines, paused_at + 2, paused_to))
    kept = beside_paused / solo if solo else 0.0
    real = gc.real_gpu
    gc.record(
        "pause: the guaranteed pod's TFLOP/s alone / beside its neighbour / neighbour paused",
        {"alone": round(solo, 1), "shared": round(shared, 1), "paused": round(beside_paused, 1),
         "paused_vs_alone": round(kept, 3)},
        f">= {KEPT} of alone while the neighbour is paused",
        kept >= KEPT if real else None,
    )  # fmt: skip
    during = rates(o_lines, paused_at + 2, paused_to)
    gc.record("pause: the paused pod's GEMM windows ending while paused", len(during), "0",
              not during)  # fmt: skip
    after = [float(x["t"]) for x in o_lines if "t" in x and float(x["t"]) > withdrawn]
    gc.record(
        "pause: seconds from the request to the freeze recorded / from the withdrawal to the "
        "thaw recorded / to the paused pod's first GEMM window ending",
        {"freeze": round(paused_at - asked, 2), "thaw": round(thawed_at - withdrawn, 2),
         "first_window": round(after[0] - withdrawn, 2) if after else None},
        "thaw within 2 s",
        (thawed_at - withdrawn) <= 2.0,
    )  # fmt: skip
    finished = next((x for x in o_lines if "result_same" in x), {})
    status: dict[str, Any] = ended[opportunistic]["status"]
    pod_restarts = sum(int(c.get("restartCount", 0)) for c in status.get("containerStatuses", []))
    ok = (
        status.get("phase") == "Succeeded"
        and finished.get("result_same") is True
        and all(x.get("same", True) for x in o_lines)
        and pod_restarts == 0
    )
    gc.record(
        "pause: the paused pod's phase, result and restarts",
        {"phase": status.get("phase"), "result_same": finished.get("result_same"),
         "restarts": pod_restarts},
        "Succeeded, the result computed before the pause, 0 restarts",
        ok,
    )  # fmt: skip
    assert ok, (status, finished)
    assert not during, during
    if real:
        assert kept >= KEPT, (solo, shared, beside_paused)
