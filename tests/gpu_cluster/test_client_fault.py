"""One tenant's fatal GPU fault in the cluster: a pod writes to an unmapped device address beside a
victim pod on the same GPU. The fault reaches the clients of that GPU's MPS server only (a pod on
the node's other GPU keeps its rate), the node agent reports both pods involved with Events
(docs/reliability.md, "One tenant's fatal GPU fault"), and the GPU takes a new pod once they
have exited.
"""

import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.names import ANN_GPU_UUID
from tests.gpu_cluster.harness import (
    TEST_NAMESPACE,
    GpuCluster,
    Obj,
    exporter_text,
    node_gpus,
    wait_for,
)

pytestmark = [pytest.mark.gpu_cluster]

FAULT_WORKER = Path(__file__).resolve().parents[1] / "faults" / "mps_fault_worker.py"
FAULT_REASONS = {"GpuShareFault", "GpuShareFaultVictim"}
RATE_TOLERANCE = 0.15
"""The other GPU's pod: its rate around the fault within 15% of its rate before."""


def fault_events(gc: GpuCluster, pod: str) -> set[str]:
    events = gc.kjson(
        "get", "events", "-n", TEST_NAMESPACE, "--field-selector", f"involvedObject.name={pod}"
    )["items"]
    return {e["reason"] for e in events if e["reason"] in FAULT_REASONS}


def incidents(gc: GpuCluster) -> dict[str, float]:
    """gpushare_mps_fault_incidents_total summed by GPU UUID."""
    out: dict[str, float] = {}
    for line in exporter_text(gc).splitlines():
        if line.startswith("gpushare_mps_fault_incidents_total{"):
            labels, _, value = line.rpartition(" ")
            uuid = labels.split('gpu_uuid="', 1)[1].split('"', 1)[0]
            out[uuid] = out.get(uuid, 0.0) + float(value)
    return out


def test_a_client_fault_stays_on_its_gpu_and_both_pods_are_reported(gc: GpuCluster) -> None:
    gc.require_gpu()
    gpus = node_gpus(gc)
    two = len(gpus) >= 2
    victim, faulter, bystander, after = "victim", "faulter", "bystander", "after-fault"
    gc.delete_pods(victim, faulter, bystander, after)
    until = time.time() + 75
    pods: list[Obj] = []
    if two:  # 75% fills one GPU; the 50% pods then both fit only on the other one
        pods.append(gc.cuda_pod(bystander, ["gemm", f"{until:.0f}"], fraction="0.75"))
        gc.create(*pods)
        gc.wait_phase([bystander], {"Running"}, timeout_s=120)
    before = incidents(gc)
    gc.create(gc.cuda_pod(victim, ["gemm", f"{until:.0f}"], fraction="0.5"))
    try:
        gc.wait_phase([victim], {"Running"}, timeout_s=120)
        wait_for(lambda: sum("t" in x for x in gc.logs(victim)) >= 3, timeout_s=90, what="rates")
        gc.create(gc.cuda_pod(faulter, ["fault-after", "8"], fraction="0.5", worker=FAULT_WORKER))
        placed = gc.wait_phase([victim, faulter], {"Running", "Succeeded", "Failed"}, timeout_s=120)
        uuids = {n: p["metadata"]["annotations"][ANN_GPU_UUID] for n, p in placed.items()}
        assert uuids[victim] == uuids[faulter], f"victim and faulter not on one GPU: {uuids}"
        ended = gc.wait_phase([victim, faulter], {"Succeeded", "Failed"}, timeout_s=120)
        fault_line = next((x for x in gc.logs(faulter) if "fault_at" in x), {})
        victim_lines = gc.logs(victim)
        reported = wait_for(
            lambda: (
                {n: sorted(fault_events(gc, n)) for n in (victim, faulter)}
                if all(fault_events(gc, n) for n in (victim, faulter))
                else None
            ),
            timeout_s=30,
            what="fault Events on both pods",
        )
        counted = incidents(gc)
        # Recovery: once both have exited, a new pod on that GPU runs.
        gc.create(gc.cuda_pod(after, ["devices"], fraction="0.5"))
        recovered = gc.wait_phase([after], {"Succeeded", "Failed"}, timeout_s=180)[after]
        if two:
            gc.wait_phase([bystander], {"Succeeded", "Failed"}, timeout_s=until - time.time() + 60)
        bystander_lines = gc.logs(bystander) if two else []
        bystander_phase = gc.pod(bystander)["status"]["phase"] if two else None
    finally:
        gc.delete_pods(victim, faulter, bystander, after)

    fault_at = float(fault_line.get("fault_at", 0.0))
    gc.record(
        "client fault: the faulter's store (CUDA error) and the victim's end",
        {
            "faulter": {"rc": fault_line.get("rc"), "how": fault_line.get("how")},
            "victim_phase": ended[victim]["status"]["phase"],
        },
        "faulter rc 700 (illegal address); the victim loses its context",
        fault_line.get("rc") == 700,
        str(next((x.get("text", "") for x in victim_lines if "illegal" in str(x)), ""))[:200],
    )
    assert fault_at > 0, gc.logs(faulter)
    ok = all(reported[n] for n in (victim, faulter))
    gc.record("client fault: Events on the pods involved", reported, "both pods", ok)
    assert ok, reported
    gpu = uuids[victim]
    grew = counted.get(gpu, 0.0) - before.get(gpu, 0.0)
    others = {u: counted.get(u, 0.0) - before.get(u, 0.0) for u in gpus if u != gpu}
    ok = grew >= 1 and not any(others.values())
    gc.record(
        "client fault: gpushare_mps_fault_incidents_total by GPU (increase)",
        {"fault GPU": grew, "other GPUs": others},
        ">= 1 on the fault's GPU, 0 elsewhere",
        ok,
    )
    assert ok, (before, counted)
    ran = recovered["status"]["phase"] == "Succeeded"
    gc.record("client fault: a new pod on that GPU afterwards", recovered["status"]["phase"],
              "Succeeded", ran)  # fmt: skip
    assert ran, gc.logs(after)
    if not two:
        gc.record("client fault: a pod on another GPU", "one GPU", "two GPUs", None)
        return
    rates: dict[str, Any] = {
        "before": [x["tflops"] for x in bystander_lines if "t" in x and x["t"] < fault_at - 1],
        "around": [x["tflops"] for x in bystander_lines if "t" in x and abs(x["t"] - fault_at) < 5],
    }
    kept = (
        bystander_phase == "Succeeded"
        and bool(rates["before"])
        and bool(rates["around"])
        and abs(statistics.mean(rates["around"]) / statistics.mean(rates["before"]) - 1)
        <= RATE_TOLERANCE
    )
    gc.record(
        "client fault: the pod on the other GPU (phase, TFLOP/s before / within 5 s of the fault)",
        {
            "phase": bystander_phase,
            "before": round(statistics.mean(rates["before"]), 1) if rates["before"] else None,
            "around": round(statistics.mean(rates["around"]), 1) if rates["around"] else None,
        },
        "Succeeded, rate within 15%",
        kept,
    )
    assert kept, (bystander_phase, rates)
