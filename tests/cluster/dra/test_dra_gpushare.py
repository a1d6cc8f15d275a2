"""A GpuShare governs DRA-mode pods, on the DRA-mode local cluster with the agent's two
simulated GPUs: the controller's claim allocator holds the share's pods while it profiles the
elected one alone on a GPU, the operator profiles that claim's GPU, and the next pod is placed
with the measured profile (docs/dra.md, "GpuShares and profiles").

The operator runs as its own process scoped to the test's namespace, as in
tests/cluster/test_operator_cluster.py, watching the claims (``--dra``) as the controller's
embedded operator does; the controller's allocator places the claims. The same operator's
latency protection evicts a DRA batch pod from a saturated GPU holding a DRA latency pod.
"""

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.dra import ANN_DRA_GPU, PLACEMENT_GATE
from gpushare.api.gpushare_crd import ANN_PACKING_POLICY, ANN_PROFILE, ANN_PROFILING
from gpushare.api.names import (
    ANN_CLASS,
    ANN_FRACTION,
    ANN_SHARE,
    LABEL_NEIGHBOUR_RULES,
    LABEL_SHARE_SELECTORS,
)
from gpushare.node.simload import PIPE_WEIGHTS
from tests.cluster.dra.test_dra_annotations import annotated_pod
from tests.cluster.dra.test_dra_placement import claim_of, device_of, pod, wait_running
from tests.cluster.test_operator_cluster import (
    CRD,
    SIMULATED_MODEL,
    OperatorProcess,
    apply,
    drop_share_finalizers,
    events,
    protection_args,
    share_manifest,
    share_status,
    wait_phase,
)
from tests.fixtures.chart_release import wait_for
from tests.fixtures.cluster import REPO, LocalCluster
from tests.fixtures.controller import ControllerProcess
from tests.fixtures.dra import METRICS_PORT, container_env, release_pods

pytestmark = pytest.mark.cluster

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def crd(dra_cluster: LocalCluster) -> None:
    dra_cluster.kubectl("apply", "-f", str(CRD))
    dra_cluster.kubectl("wait", "--for", "condition=established", "crd/gpushares.gpushare.io")


@pytest.fixture
def namespace(
    dra_cluster: LocalCluster, dra_controller: ControllerProcess, crd: None
) -> Iterator[str]:
    """A namespace served by the DRA-mode webhook, whose shares may profile pods alone."""
    c = dra_cluster
    ns = f"dra-share-{uuid.uuid4().hex[:6]}"
    c.kubectl("create", "namespace", ns)
    c.kubectl("label", "namespace", ns, dra_controller.namespace_label)
    c.kubectl("label", "namespace", ns, f"{LABEL_NEIGHBOUR_RULES}=granted")
    c.kubectl("label", "namespace", ns, f"{LABEL_SHARE_SELECTORS}=enabled")
    yield ns
    release_pods(c, ns)
    drop_share_finalizers(c, ns)
    c.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture
def operator(
    dra_cluster: LocalCluster, namespace: str, dra_agent: list[Obj], tmp_path: Path
) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(
        cluster=dra_cluster,
        namespace=namespace,
        agent_url=f"http://127.0.0.1:{METRICS_PORT}",
        log_path=tmp_path / "operator.log",
        args=["--no-protection", "--dra"],
    )
    proc.start()
    yield proc
    proc.stop()


def create(c: LocalCluster, ns: str, name: str) -> None:
    body = annotated_pod(c, name, {ANN_SHARE: "train"})
    body["metadata"]["labels"] = {"app": "train"}
    c.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(body))


def test_a_share_profiles_its_first_dra_pod_alone_then_places_the_next_with_the_profile(
    dra_cluster: LocalCluster,
    dra_agent: list[Obj],
    dra_controller: ControllerProcess,
    namespace: str,
    operator: OperatorProcess,
) -> None:
    c, ns = dra_cluster, namespace
    apply(
        c,
        share_manifest(
            "train",
            ns,
            fraction="0.3",
            selector={"matchLabels": {"app": "train"}},
            profiling={"windowSeconds": 15},
        ),
    )
    wait_phase(c, "train", ns, "Pending", timeout_s=30)
    create(c, ns, "train-0")
    profiling = wait_phase(c, "train", ns, "Profiling", timeout_s=60)
    assert profiling["profilingPod"] == "train-0"

    # A second pod of the share waits gated while the first is profiled, saying why.
    create(c, ns, "train-1")
    wait_running(c, ns, "train-0")
    held = wait_for(
        lambda: c.events(ns, name="train-1", reason="GpushareHeld"),
        timeout_s=30,
        what="train-1's GpushareHeld event",
        every_s=0.5,
    )
    assert "GpuShare train is profiling" in held[0]["message"]
    assert pod(c, ns, "train-1")["spec"]["schedulingGates"] == [{"name": PLACEMENT_GATE}]

    packed = wait_phase(c, "train", ns, "Packed", timeout_s=120)
    devices = [d for s in dra_agent for d in s["spec"]["devices"]]
    uuids = {d["name"]: d["attributes"]["uuid"]["string"] for d in devices}
    profiled_gpu = uuids[device_of(claim_of(c, ns, "train-0"))]
    ann = pod(c, ns, "train-0")["metadata"]["annotations"]
    assert ann[ANN_DRA_GPU] == profiled_gpu  # what the operator read
    assert ann[ANN_PROFILING] == "done"

    profile = packed["profile"]
    assert profile["gpuModel"] == SIMULATED_MODEL
    assert profile["simulated"] is True and profile["source"] == "measured"
    # The agent's simulated load of train-0's claim alone: a batch claim without a limit runs
    # uncapped (docs/dra.md, "Requests and limits") and a simulated pod keeps its guaranteed
    # 30 % busy (gpushare.node.simload), as an annotated pod does.
    assert profile["tensor"] == pytest.approx(PIPE_WEIGHTS["tensor"] * 0.3, rel=0.25)

    # The held pod inherited the share's rules while it waited, then was placed with the
    # measured profile (the annotation's or, if it was placed first, the share's).
    second = wait_running(c, ns, "train-1", timeout_s=60)
    inherited = second["metadata"]["annotations"]
    assert inherited[ANN_PACKING_POLICY] == "cautious"
    if ANN_PROFILE in inherited:
        assert json.loads(inherited[ANN_PROFILE])["tensor"] == profile["tensor"]
    decisions = [
        r
        for r in dra_controller.log_records()
        if r.get("msg") == "claim placed" and r.get("pod") == f"{ns}/train-1"
    ]
    assert [d["profiled"] for d in decisions] == [True]

    # The share lists both pods where their claims put them (read from the claims).
    def listed() -> list[Obj] | None:
        found = share_status(c, "train", ns).get("placements") or []
        return found if len(found) == 2 else None

    placements = wait_for(listed, timeout_s=30, what="both pods in status.placements")
    by_pod = {p["pod"]: p for p in placements}
    assert by_pod["train-0"]["gpuUuid"] == profiled_gpu
    second_gpu = uuids[device_of(claim_of(c, ns, "train-1"))]
    assert by_pod["train-1"]["gpuUuid"] == second_gpu
    assert {p["node"] for p in placements} == {second["spec"]["nodeName"]}
    # A batch claim without a limit runs uncapped.
    assert {p["threadPercent"] for p in placements} == {100}


def test_a_selector_gives_a_dra_pod_the_shares_memory_in_its_claim_its_mps_limit_and_the_cli(
    dra_cluster: LocalCluster,
    dra_agent: list[Obj],
    dra_controller: ControllerProcess,
    namespace: str,
    operator: OperatorProcess,
) -> None:
    """Issue 68, DRA mode: a pod with only the share's label is linked at admission and gets a
    claim of the share's request and memory, which the driver pins for its MPS clients and the
    CLI shows."""
    c, ns = dra_cluster, namespace
    apply(
        c,
        share_manifest(
            "mem",
            ns,
            fraction="0.25",
            memory="6Gi",
            selector={"matchLabels": {"app": "mem"}},
            profiling={"mode": "skip"},
        ),
    )
    wait_phase(c, "mem", ns, "Packed", timeout_s=60)
    body = annotated_pod(c, "mem-0", {})
    body["metadata"]["labels"] = {"app": "mem"}
    c.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(body))
    running = wait_running(c, ns, "mem-0")
    assert running["metadata"]["annotations"][ANN_SHARE] == "mem"
    (entry,) = running["spec"]["resourceClaims"]
    assert entry["resourceClaimTemplateName"] == "gpushare-25pct-6gi"
    assert container_env(c, ns, "mem-0")["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6144M"
    table = subprocess.run(
        [sys.executable, "-m", "gpushare.cli.main", "get", "pods", "-n", ns],
        capture_output=True, text=True, env=c.env, cwd=REPO, timeout=60, check=True,
    ).stdout  # fmt: skip
    (row,) = [line.split() for line in table.splitlines() if line.startswith("mem-0 ")]
    assert row[5] == "6.0Gi", table


def evicted(c: LocalCluster, ns: str, name: str) -> bool:
    """Gone, or being deleted."""
    out = c.kubectl("get", "pod", name, "-n", ns, "--ignore-not-found", "-o", "json")
    return not out.strip() or bool(json.loads(out)["metadata"].get("deletionTimestamp"))


def test_a_saturated_gpu_of_a_dra_latency_pod_evicts_its_newest_batch_neighbour(
    dra_cluster: LocalCluster,
    dra_agent: list[Obj],
    dra_controller: ControllerProcess,
    namespace: str,
    tmp_path: Path,
) -> None:
    """Latency protection in DRA mode: the operator finds the pods on a GPU from their claims,
    reads the GPU from the node agent and evicts the newest batch pod (by name and UID)."""
    c, ns = dra_cluster, namespace

    def make(name: str, fraction: str, cls: str, **ann: str) -> str:
        body = annotated_pod(c, name, {ANN_FRACTION: fraction, ANN_CLASS: cls, **ann})
        body["metadata"]["labels"] = {"app": name}
        c.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(body))
        wait_running(c, ns, name)
        return device_of(claim_of(c, ns, name))

    # Fill one GPU, so every other pod lands on the other one; the latency pod is prepared
    # first, so the driver caps the batch claims beside it at 50 %.
    blocked = make("blocker", "1", "batch")
    apply(
        c,
        share_manifest(
            "infer", ns, fraction="0.3", **{"class": "latency"}, profiling={"mode": "skip"}
        ),
    )
    gpu = make("infer", "0.3", "latency", **{ANN_SHARE: "infer"})
    assert gpu != blocked
    assert make("train-a", "0.4", "batch") == gpu
    assert make("train-b", "0.3", "batch") == gpu

    # The simulated GPU's busiest pipe follows what its claims may use (gpushare.node.simload):
    # the latency claim uncapped on 30 %, the batch ones at min(50, share). Saturation is set
    # between the load without and with the newest batch pod.
    weight = PIPE_WEIGHTS["tensor"]
    before, after = weight * min(1.0, (30 + 40) / 100), weight * min(1.0, (30 + 40 + 30) / 100)
    guard = OperatorProcess(
        cluster=c,
        namespace=ns,
        agent_url=f"http://127.0.0.1:{METRICS_PORT}",
        log_path=tmp_path / "operator.log",
        args=["--dra", *protection_args((before + after) / 2)],
    )
    guard.start()
    try:
        wait_for(
            lambda: evicted(c, ns, "train-b"),
            timeout_s=60,
            what="the newest batch pod to be evicted",
        )
        assert events(c, ns, name="train-b", reason="EvictedForLatency") == 1
        assert events(c, ns, name="infer", reason="NeighbourEvicted") >= 1
        assert share_status(c, "infer", ns)["evictions"] == 1

        # Below the threshold again: the older batch pod and the latency pod stay.
        time.sleep(10)
        for name in ("infer", "train-a", "blocker"):
            assert pod(c, ns, name)["status"]["phase"] == "Running", name
        assert events(c, ns, name="train-a", reason="EvictedForLatency") == 0
    finally:
        guard.stop()
