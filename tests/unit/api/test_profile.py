"""The one GPU profile type and its JSON codec: what the node agent answers is what the operator
reads."""

import json
import math
from dataclasses import fields
from datetime import UTC, datetime

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.api.profile import PLACEMENT_COUNTERS, RATIOS, GpuProfile
from gpushare.packing.model import PipeProfile
from gpushare.packing.stored_profile import pipe_profile

MEASURED = GpuProfile(
    gpu_uuid="GPU-1",
    gpu_model="NVIDIA H100 80GB HBM3",
    simulated=False,
    window_seconds=30.0,
    sampled_seconds=29.5,
    samples=59,
    fp16=0.01,
    fp32=0.12,
    fp64=None,
    tensor=0.55,
    tensor_hmma=0.54,
    tensor_dmma=0.0,
    tensor_imma=0.0,
    integer=0.05,
    sm_utilization=0.9,
    sm_occupancy=0.61,
    dram_bandwidth=0.33,
    utilization=0.97,
    memory_used_bytes=21e9,
    memory_used_bytes_max=23_000_000_000,
    unavailable=("fp64",),
)


def test_an_answer_reads_back_as_the_profile_the_agent_sent() -> None:
    wire = json.loads(json.dumps(MEASURED.to_json()))
    assert GpuProfile.from_json(wire) == MEASURED
    assert GpuProfile.from_json(wire).fp64 is None  # not measured stays unknown, never idle


def test_an_older_agents_answer_reads_with_what_it_has() -> None:
    old = {"gpu_model": "NVIDIA H200", "sampled_seconds": 10, "fp32": 0.2, "memory_used_bytes": 4e9}
    profile = GpuProfile.from_json(old)
    assert profile.fp32 == 0.2 and profile.tensor_hmma is None and profile.sm_utilization is None
    assert profile.peak_memory_bytes == 4_000_000_000  # no peak sent: the average


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"gpu_model": "H200", "sampled_seconds": math.nan}, "profile.sampled_seconds"),
        ({"gpu_model": "H200", "sampled_seconds": 5, "memory_used_bytes": -1}, "memory_used"),
        ({"gpu_model": "H200", "sampled_seconds": 5, "sm_occupancy": True}, "sm_occupancy"),
        ({"gpu_model": "H200", "sampled_seconds": 5, "unavailable": "fp64"}, "unavailable"),
        ({"gpu_model": "", "sampled_seconds": 5}, "profile.gpu_model"),
    ],
)
def test_a_malformed_answer_is_refused_naming_the_field(payload: object, field: str) -> None:
    with pytest.raises(InvalidInputError, match=field):
        GpuProfile.from_json(payload)


def test_the_profile_answer_keeps_its_keys_of_record() -> None:
    """One record, two wire forms: ``/profile`` keeps its snake-case keys in their order and
    says nothing of what the operator adds when it stores one (its time and source)."""
    assert list(MEASURED.to_json()) == [
        "gpu_uuid",
        "gpu_model",
        "simulated",
        "window_seconds",
        "sampled_seconds",
        "samples",
        *RATIOS,
        "memory_used_bytes",
        "memory_used_bytes_max",
        "unavailable",
    ]


def test_a_stored_profile_keeps_its_status_keys_and_reads_back_as_stored() -> None:
    stored = MEASURED.stored(now=datetime(2026, 11, 1, tzinfo=UTC))
    status = stored.to_status()
    assert set(status) == {
        "gpuModel",
        "sampledSeconds",
        "time",
        "simulated",
        "source",
        "fp16",
        "fp32",
        "tensor",
        "tensorHmma",
        "tensorDmma",
        "tensorImma",
        "smUtilization",
        "smOccupancy",
        "dramBandwidth",
        "utilization",
        "memoryBytes",
    }  # fp64 was not measured; integer work is not stored
    assert status["memoryBytes"] == 23_000_000_000  # the peak: what a memory cap must allow
    assert GpuProfile.from_status(status) == stored


def test_the_policy_reads_the_counters_of_record() -> None:
    policy = {f.name for f in fields(PipeProfile)}
    assert set(PLACEMENT_COUNTERS) <= policy <= {*RATIOS, "gpu_model"}
    assert pipe_profile(MEASURED.stored(now=datetime(2026, 11, 1, tzinfo=UTC))) == PipeProfile(
        fp16=0.01,
        fp32=0.12,
        fp64=0.0,  # not measured reads as idle to the policy
        tensor=0.55,
        sm_occupancy=0.61,
        dram_bandwidth=0.33,
        gpu_model="NVIDIA H100 80GB HBM3",
        sm_utilization=0.9,
        utilization=0.97,
    )
