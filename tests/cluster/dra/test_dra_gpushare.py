"""A GpuShare governs DRA-mode pods, on the DRA-mode local cluster with the agent's two
simulated GPUs: the controller's claim allocator holds the share's pods while it profiles the
elected one alone on a GPU, the operator profiles that claim's GPU, and the next pod is placed
with the measured profile (docs/dra.md, "GpuShares and profiles").

The operator runs as its own process scoped to the test's namespace, as in
tests/cluster/test_operator_cluster.py; the controller's allocator places the claims.
"""

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.dra import ANN_DRA_GPU, PLACEMENT_GATE
from gpushare.api.gpushare_crd import ANN_PACKING_POLICY, ANN_PROFILE, ANN_PROFILING
from gpushare.api.names import ANN_SHARE, LABEL_NEIGHBOUR_RULES
from gpushare.node.load import PIPE_WEIGHTS
from tests.cluster.dra.test_dra_annotations import annotated_pod
from tests.cluster.dra.test_dra_placement import claim_of, device_of, pod, wait_running
from tests.cluster.test_operator_cluster import (
    CRD,
    SIMULATED_MODEL,
    OperatorProcess,
    apply,
    drop_share_finalizers,
    share_manifest,
    wait_phase,
)
from tests.fixtures.chart_release import wait_for
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.controller import ControllerProcess
from tests.fixtures.dra import METRICS_PORT, release_pods

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
        args=["--no-protection"],
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
    # uncapped (docs/dra.md, "Requests and limits"), so tensor is near its full weight.
    assert profile["tensor"] == pytest.approx(PIPE_WEIGHTS["tensor"], rel=0.25)

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
