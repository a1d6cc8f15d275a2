"""Reading an allocated ResourceClaim: what the pod gets, and hostile claims refused by field."""

from typing import Any

import pytest

from gpushare.api.dra import DRIVER, device_name
from gpushare.api.errors import InvalidInputError
from gpushare.node.dra.claims import ClaimPlan, ClaimRef, parse_claim
from tests.unit.node.dra.helpers import GIB, NODE, backend, claim, mps_config

GPUS = {device_name(g.index): g for g in backend().inventory()}
UID = "0b1c2d3e-0000-4000-8000-000000000001"
REF = ClaimRef(namespace="ns", uid=UID, name="c1")


def parse(manifest: dict[str, Any]) -> ClaimPlan:
    return parse_claim(manifest, ref=REF, pool=NODE, gpus=GPUS)


def refused(manifest: dict[str, Any]) -> InvalidInputError:
    with pytest.raises(InvalidInputError) as caught:
        parse(manifest)
    return caught.value


def test_a_shared_claim_gets_its_share_class_and_limit() -> None:
    plan = parse(
        claim(
            consumed={"gpuPercent": "25", "memory": "20Gi"},
            config=mps_config(**{"class": "latency", "limit": 50}),
        )
    )
    (gpu,) = plan.gpus
    assert gpu.gpu.uuid == GPUS["gpu-0"].uuid
    assert (gpu.percent, gpu.config.limit, gpu.memory_limit_bytes) == (25, 50, 20 * GIB)
    assert gpu.config.gpu_class == "latency"
    assert plan.pod == "ns/p1"


def test_memory_not_asked_for_is_the_share_of_the_gpu() -> None:
    (gpu,) = parse(claim(consumed={"gpuPercent": "25", "memory": "0"})).gpus
    assert gpu.memory_limit_bytes == GPUS["gpu-0"].memory_bytes * 25 // 100
    assert gpu.config.gpu_class == "batch"


def test_without_consumed_capacity_the_claim_has_the_whole_gpu() -> None:
    """Feature gate DRAConsumableCapacity off: the scheduler allocated the device whole."""
    (gpu,) = parse(claim(consumed=None)).gpus
    assert (gpu.percent, gpu.memory_limit_bytes) == (100, GPUS["gpu-0"].memory_bytes)


def test_a_config_for_another_request_does_not_apply() -> None:
    manifest = claim(
        consumed={"gpuPercent": "30"},
        config=mps_config(**{"class": "latency"}),
        config_requests=["other"],
    )
    assert parse(manifest).gpus[0].config.gpu_class == "batch"


def test_a_claim_that_is_not_allocated_is_refused() -> None:
    manifest = claim()
    del manifest["status"]["allocation"]
    assert refused(manifest).field == "status.allocation"


def test_a_claim_of_another_driver_is_refused() -> None:
    error = refused(claim(driver="gpu.nvidia.com"))
    assert DRIVER in str(error)
    assert error.field == "status.allocation.devices.results"


def test_a_recreated_claim_with_another_uid_is_refused() -> None:
    manifest = claim(uid="ffffffff-0000-4000-8000-000000000009")
    assert refused(manifest).field == "metadata.uid"


@pytest.mark.parametrize("value", ["0", "101", "25.5", "abc", "1" * 30, True, None])
def test_consumed_gpu_percent_out_of_range_is_refused(value: object) -> None:
    error = refused(claim(consumed={"gpuPercent": value}))
    assert error.field == "status.allocation.devices.results[0].consumedCapacity.gpuPercent"


def test_consumed_memory_above_the_gpu_is_refused() -> None:
    error = refused(claim(consumed={"gpuPercent": "25", "memory": "1Ti"}))
    assert error.field == "status.allocation.devices.results[0].consumedCapacity.memory"


def test_unknown_opaque_fields_are_refused_by_name() -> None:
    error = refused(claim(consumed={"gpuPercent": "25"}, config=mps_config(threads=99)))
    assert error.field == "status.allocation.devices.config[0].opaque.parameters.threads"


def test_a_limit_below_the_consumed_share_is_refused() -> None:
    error = refused(claim(consumed={"gpuPercent": "50"}, config=mps_config(limit=20)))
    assert error.field.endswith("parameters.limit")


def test_a_device_of_another_node_or_unknown_gpu_is_refused() -> None:
    assert refused(claim(pool="other-node")).field.endswith("results[0].pool")
    assert refused(claim(devices=("gpu-7",))).field.endswith("results[0].device")


def test_several_shared_devices_are_refused_and_whole_ones_accepted() -> None:
    shared = claim(devices=("gpu-0", "gpu-1"), consumed={"gpuPercent": "50"})
    assert "one GPU's MPS server" in str(refused(shared))
    whole = parse(claim(devices=("gpu-0", "gpu-1"), consumed={"gpuPercent": "100"}))
    assert [g.device for g in whole.gpus] == ["gpu-0", "gpu-1"]


def test_a_claim_reserved_for_no_pod_is_refused() -> None:
    assert refused(claim(pod=None)).field == "status.reservedFor"
