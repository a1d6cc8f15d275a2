"""Preparing and unpreparing claims: CDI specs, MPS limits, and the checkpoint across restarts."""

import json
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.api.pod import PodInfo
from gpushare.node.core.answer import AllocationError
from gpushare.node.dra.cdi import CdiDir
from gpushare.node.dra.claims import ClaimRef
from gpushare.node.mps.limits import FLOOR, MpsLimitKeeper
from gpushare.node.mps.manager import MpsManager
from tests.unit.node.dra.helpers import (
    GIB,
    FakeClaims,
    FakeLimits,
    backend,
    claim,
    make_driver,
    mps_config,
)

UID = "0b1c2d3e-0000-4000-8000-000000000001"
REF = ClaimRef(namespace="ns", uid=UID, name="c1")
SHARED = claim(
    consumed={"gpuPercent": "25", "memory": "20Gi"},
    config=mps_config(**{"class": "batch", "limit": 50}),
)


def cdi_spec(tmp_path: Path) -> dict[str, Any]:
    return dict(json.loads(CdiDir(tmp_path / "cdi").path(UID).read_text()))


def env(spec: dict[str, Any]) -> dict[str, str]:
    edits = spec["devices"][0]["containerEdits"]
    return dict(item.split("=", 1) for item in edits["env"])


def test_a_shared_claim_gets_a_cdi_device_with_its_mps_settings(tmp_path: Path) -> None:
    limits = FakeLimits()
    record = make_driver(tmp_path, FakeClaims(SHARED), limits=limits).prepare(REF)
    uuid = backend().inventory()[0].uuid
    assert record.cdi_ids == (f"gpushare.io/gpu=claim-{UID}",)
    spec = cdi_spec(tmp_path)
    assert (spec["cdiVersion"], spec["kind"]) == ("0.6.0", "gpushare.io/gpu")
    assert spec["devices"][0]["name"] == f"claim-{UID}"
    variables = env(spec)
    assert variables["CUDA_VISIBLE_DEVICES"] == uuid
    assert variables["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert variables["CUDA_MPS_CLIENT_PRIORITY"] == "1"
    assert variables["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    mounts = {
        m["containerPath"]: m["hostPath"] for m in spec["devices"][0]["containerEdits"]["mounts"]
    }
    assert mounts[variables["CUDA_MPS_PIPE_DIRECTORY"]] == str(tmp_path / "mps" / uuid / "pipe")
    assert mounts["/dev/shm"] == str(tmp_path / "mps" / uuid / "shm")
    # The server enforces what the client environment only asks for (docs/security.md).
    assert limits.raised == [(uuid, 50, 20 * GIB)]


def test_thread_caps_follow_the_request_and_limit_rule_of_annotated_pods(tmp_path: Path) -> None:
    """gpuPercent is what a claim is guaranteed, MpsConfig.limit what it may use (as for
    annotated pods, gpushare.packing.threads): a batch claim alone is not throttled, a latency
    claim runs uncapped at priority 0, and a batch claim prepared after it on its GPU keeps
    half the SMs out of its reach."""
    uids = [f"0b1c2d3e-0000-4000-8000-00000000000{i}" for i in (2, 3, 4)]
    batch_alone = claim(uid=uids[0], name="b0", consumed={"gpuPercent": "30"}, devices=("gpu-1",))
    latency = claim(
        uid=uids[1],
        name="l",
        consumed={"gpuPercent": "40"},
        config=mps_config(**{"class": "latency"}),
    )
    batch_beside = claim(uid=uids[2], name="b1", consumed={"gpuPercent": "30"})
    driver = make_driver(tmp_path, FakeClaims(batch_alone, latency, batch_beside))
    caps = {}
    for uid, c in zip(uids, (batch_alone, latency, batch_beside), strict=True):
        record = driver.prepare(ClaimRef(namespace="ns", uid=uid, name=c["metadata"]["name"]))
        caps[c["metadata"]["name"]] = (record.thread_percent, record.gpu_class)
    assert caps == {"b0": (100, "batch"), "l": (100, "latency"), "b1": (50, "batch")}


def test_a_whole_gpu_claim_goes_without_mps(tmp_path: Path) -> None:
    limits = FakeLimits()
    driver = make_driver(tmp_path, FakeClaims(claim(consumed={"gpuPercent": "100"})), limits=limits)
    record = driver.prepare(REF)
    variables = env(cdi_spec(tmp_path))
    assert variables == {"CUDA_VISIBLE_DEVICES": backend().inventory()[0].uuid}
    assert not record.mps
    assert limits.raised == []
    assert driver.shares() == {}


def test_prepare_after_a_restart_answers_from_the_checkpoint(tmp_path: Path) -> None:
    first = make_driver(tmp_path, FakeClaims(SHARED)).prepare(REF)
    claims = FakeClaims()  # the claim cannot be read: the answer must come from the checkpoint
    restarted = make_driver(tmp_path, claims)
    assert restarted.prepare(REF) == first
    assert claims.reads == 0
    uuid = backend().inventory()[0].uuid
    assert restarted.shares() == {uuid: [(50, 20 * GIB)]}
    # What the claim is guaranteed survives too (the simulated load counts it).
    assert [c.percent for c in restarted.prepared().values()] == [25]


def test_a_checkpoint_written_before_percents_were_recorded_still_loads(tmp_path: Path) -> None:
    make_driver(tmp_path, FakeClaims(SHARED)).prepare(REF)
    path = next(p for p in tmp_path.rglob("*.json") if "cdi" not in p.parts)
    raw = json.loads(path.read_text())
    entries = raw["claims"] if isinstance(raw, dict) and "claims" in raw else raw
    for entry in entries.values() if isinstance(entries, dict) else entries:
        entry.pop("percent")
    path.write_text(json.dumps(raw))
    [claim] = make_driver(tmp_path, FakeClaims()).prepared().values()
    assert claim.percent is None and claim.thread_percent == 50


def test_unprepare_after_a_restart_removes_the_spec_and_the_record(tmp_path: Path) -> None:
    make_driver(tmp_path, FakeClaims(SHARED)).prepare(REF)
    restarted = make_driver(tmp_path, FakeClaims())
    restarted.unprepare(UID)
    assert not CdiDir(tmp_path / "cdi").exists(UID)
    assert make_driver(tmp_path, FakeClaims()).prepared() == {}


def test_unprepare_of_an_unknown_claim_succeeds_twice(tmp_path: Path) -> None:
    driver = make_driver(tmp_path, FakeClaims())
    driver.unprepare(UID)
    driver.unprepare(UID)
    assert driver.prepared() == {}


def test_a_wiped_cdi_directory_is_written_again_from_the_checkpoint(tmp_path: Path) -> None:
    driver = make_driver(tmp_path, FakeClaims(SHARED))
    driver.prepare(REF)
    before = cdi_spec(tmp_path)
    CdiDir(tmp_path / "cdi").remove(UID)
    make_driver(tmp_path, FakeClaims()).prepare(REF)
    assert cdi_spec(tmp_path) == before


def test_a_refused_claim_leaves_nothing_behind(tmp_path: Path) -> None:
    driver = make_driver(tmp_path, FakeClaims(claim(consumed={"gpuPercent": "0"})))
    with pytest.raises(InvalidInputError):
        driver.prepare(REF)
    assert not CdiDir(tmp_path / "cdi").exists(UID)
    assert driver.prepared() == {}


def test_a_missing_claim_and_a_hostile_uid_are_refused(tmp_path: Path) -> None:
    driver = make_driver(tmp_path, FakeClaims())
    with pytest.raises(InvalidInputError, match="does not exist"):
        driver.prepare(REF)
    with pytest.raises(InvalidInputError, match="not a Kubernetes UID"):
        driver.prepare(ClaimRef(namespace="ns", uid="../../etc/x", name="c1"))
    with pytest.raises(InvalidInputError):
        driver.unprepare("../x")


def test_an_unreadable_checkpoint_is_set_aside(tmp_path: Path) -> None:
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "checkpoint.json").write_text("{not json")
    driver = make_driver(tmp_path, FakeClaims(SHARED))
    assert driver.prepared() == {}
    assert (tmp_path / "plugin" / "checkpoint.json.corrupt").exists()
    driver.prepare(REF)
    assert UID in make_driver(tmp_path, FakeClaims()).prepared()


def test_prepared_claims_hold_their_gpus_mps_server_limits(tmp_path: Path) -> None:
    """A pod of a claim carries no placement annotation: without the claims, the limit keeper's
    refresh would lower its GPU's server to the floor under the running pod."""
    driver = make_driver(tmp_path, FakeClaims(SHARED))
    driver.prepare(REF)
    mps = MpsManager(root=tmp_path / "mps", simulated=True)
    gpus = backend().inventory()
    keeper = MpsLimitKeeper(
        mps=mps,
        gpu_memory=lambda: {g.uuid: g.memory_bytes for g in gpus},
        claimed=driver.shares,
    )
    limits = keeper.sync([])
    assert (limits[gpus[0].uuid].thread_percent, limits[gpus[0].uuid].memory_bytes) == (
        50,
        20 * GIB,
    )
    assert limits[gpus[1].uuid] == FLOOR
    driver.unprepare(UID)
    assert keeper.sync([])[gpus[0].uuid] == FLOOR


def test_a_pod_with_another_uid_than_its_gpus_mps_clients_is_refused(tmp_path: Path) -> None:
    """An MPS server serves one UID at a time: the second pod would wait for the first."""
    other = "0b1c2d3e-0000-4000-8000-000000000002"
    third = "0b1c2d3e-0000-4000-8000-000000000003"
    pods = [
        PodInfo(namespace="ns", name="p1", uid="a", annotations={}, run_as_user=1000),
        PodInfo(namespace="ns", name="p2", uid="b", annotations={}, run_as_user=2000),
    ]
    claims = FakeClaims(
        claim(uid=UID, name="c1", consumed={"gpuPercent": "25"}, pod="p1"),
        claim(uid=other, name="c2", consumed={"gpuPercent": "25"}, pod="p2"),
        claim(uid=third, name="c3", devices=("gpu-1",), consumed={"gpuPercent": "25"}, pod="p2"),
    )
    driver = make_driver(tmp_path, claims, pods=lambda: pods)
    driver.prepare(REF)
    with pytest.raises(AllocationError, match="runs as UID 2000"):
        driver.prepare(ClaimRef(namespace="ns", uid=other, name="c2"))
    assert not CdiDir(tmp_path / "cdi").exists(other)
    driver.prepare(ClaimRef(namespace="ns", uid=third, name="c3"))


def test_claims_of_two_namespaces_do_not_share_a_gpus_mps_server(tmp_path: Path) -> None:
    """kube-scheduler allocates claims without gpushare's tenancy rule, so prepare holds the
    boundary: a claim of team-b on the GPU serving team-a is refused, naming both and the fix,
    and team-a's claim keeps its record and spec. Grouping the namespaces lets it in."""
    uids = [f"0b1c2d3e-0000-4000-8000-00000000001{i}" for i in (1, 2, 3)]
    a = claim(uid=uids[0], name="a", namespace="team-a", consumed={"gpuPercent": "30"})
    b = claim(uid=uids[1], name="b", namespace="team-b", consumed={"gpuPercent": "30"})
    other_gpu = claim(
        uid=uids[2], name="c", namespace="team-b", consumed={"gpuPercent": "30"}, devices=("gpu-1",)
    )
    claims = FakeClaims(a, b, other_gpu)
    driver = make_driver(tmp_path, claims)
    driver.prepare(ClaimRef(namespace="team-a", uid=uids[0], name="a"))
    ref_b = ClaimRef(namespace="team-b", uid=uids[1], name="b")
    with pytest.raises(InvalidInputError) as refused:
        driver.prepare(ref_b)
    message = str(refused.value)
    assert "team-a/a" in message and "'team-b'" in message
    assert "gpushare.io/sharing-group" in message and "crossNamespaceSharing" in message
    assert set(driver.prepared()) == {uids[0]}
    assert CdiDir(tmp_path / "cdi").exists(uids[0]) and not CdiDir(tmp_path / "cdi").exists(uids[1])
    # team-b on a GPU of its own is fine.
    driver.prepare(ClaimRef(namespace="team-b", uid=uids[2], name="c"))
    # An admin puts both namespaces in one sharing group after team-a's claim was prepared:
    # the kubelet's next try succeeds.
    claims.namespaces = {ns: {"gpushare.io/sharing-group": "ml"} for ns in ("team-a", "team-b")}
    assert driver.prepare(ref_b).tenancy == "group:ml"


def test_without_a_tenancy_boundary_any_claims_share(tmp_path: Path) -> None:
    a = claim(uid=UID, name="a", namespace="team-a", consumed={"gpuPercent": "30"})
    uid_b = "0b1c2d3e-0000-4000-8000-000000000021"
    b = claim(uid=uid_b, name="b", namespace="team-b", consumed={"gpuPercent": "30"})
    driver = make_driver(tmp_path, FakeClaims(a, b))
    driver.tenancy = "cluster"
    driver.prepare(ClaimRef(namespace="team-a", uid=UID, name="a"))
    assert driver.prepare(ClaimRef(namespace="team-b", uid=uid_b, name="b")).tenancy == ""
