"""Latency protection decisions on recorded GPU readings: when to evict, and whom.

Readings are per-pipe GPM values as recorded on an H200 (DESIGN.md): a bf16 GEMM keeps the
HMMA tensor pipe at 78%, an fp32 GEMM the FP32 pipe at 77%, an fp64 GEMM the DMMA tensor pipe
at 95% (the FP64 pipe near 0). A ResNet-50 inference job alone is light; beside training the
GPU runs flat out.
"""

import json
from datetime import UTC, datetime, timedelta

from gpushare.api.gpushare_crd import ANN_PROFILE, ANN_PROFILING
from gpushare.api.names import ANN_CLASS, RESOURCE_GPU_PERCENT
from gpushare.api.placement import Placement
from gpushare.api.profile import GpuProfile
from gpushare.cluster.operator.guard import interference_predictor
from gpushare.cluster.operator.protection import (
    ProtectionPolicy,
    ProtectionTracker,
    choose_victim,
    judge,
)
from gpushare.cluster.state.pod_facts import PodFacts, facts
from gpushare.cluster.state.view import ClusterView
from gpushare.packing.interference import load_default

BF16_GEMM = GpuProfile(
    fp16=0.01, fp32=0.02, fp64=0.0, tensor=0.78, sm_occupancy=0.5, dram_bandwidth=0.3
)
FP32_GEMM = GpuProfile(
    fp16=0.0, fp32=0.77, fp64=0.0, tensor=0.0, sm_occupancy=0.5, dram_bandwidth=0.2
)
FP64_GEMM = GpuProfile(
    fp16=0.0, fp32=0.0, fp64=0.01, tensor=0.95, sm_occupancy=0.5, dram_bandwidth=0.2
)
INFERENCE_ALONE = GpuProfile(
    fp16=0.02, fp32=0.08, fp64=0.0, tensor=0.22, sm_occupancy=0.3, dram_bandwidth=0.15
)
INFERENCE_BESIDE_TRAINING = GpuProfile(
    fp16=0.05, fp32=0.3, fp64=0.0, tensor=0.93, sm_occupancy=0.9, dram_bandwidth=0.7
)
NO_GPM = GpuProfile()  # a pre-Hopper GPU: every pipe counter unavailable

POLICY = ProtectionPolicy(
    saturation_threshold=0.9, slowdown_bound=1.5, bad_readings=3, cooldown_s=60
)
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
GPU = "GPU-11111111-2222-4333-8444-555555555555"


def test_saturated_pipe_is_bad_and_names_the_pipe() -> None:
    verdict = judge(FP64_GEMM, policy=POLICY)
    assert verdict.bad and "tensor at 95%" in verdict.why
    assert judge(INFERENCE_BESIDE_TRAINING, policy=POLICY).bad


def test_busy_but_unsaturated_gpus_are_left_alone() -> None:
    for reading in (BF16_GEMM, FP32_GEMM, INFERENCE_ALONE):
        assert not judge(reading, policy=POLICY).bad


def test_gpu_without_counters_is_never_judged_bad_on_saturation() -> None:
    verdict = judge(NO_GPM, policy=POLICY)
    assert not verdict.bad and verdict.why == "no counters"


def test_predicted_slowdown_past_the_bound_is_bad_even_below_saturation() -> None:
    assert judge(BF16_GEMM, policy=POLICY, predicted_slowdown=1.8).bad
    assert not judge(BF16_GEMM, policy=POLICY, predicted_slowdown=1.2).bad


def test_recorded_sequence_evicts_after_three_bad_readings_in_a_row_then_cools_down() -> None:
    tracker = ProtectionTracker(POLICY)
    busy = INFERENCE_BESIDE_TRAINING
    # A dip in the middle resets the streak: a burst is not a trend.
    sequence = [INFERENCE_ALONE, busy, busy, INFERENCE_ALONE, busy, busy, busy]
    decisions = [
        tracker.observe(GPU, bad=judge(r, policy=POLICY).bad, now=float(t))
        for t, r in enumerate(sequence)
    ]
    assert decisions == [False, False, False, False, False, False, True]
    tracker.evicted(GPU, now=6.0)
    # Still saturated right after the eviction: no second eviction within the cool-down.
    again = [tracker.observe(GPU, bad=True, now=7.0 + t) for t in range(10)]
    assert not any(again)
    assert tracker.observe(GPU, bad=True, now=70.0)


def test_a_refused_eviction_keeps_the_streak_and_is_reported_once() -> None:
    tracker = ProtectionTracker(POLICY)
    for t in range(3):
        due = tracker.observe(GPU, bad=True, now=float(t))
    assert due
    assert tracker.blocked(GPU) is True
    assert tracker.observe(GPU, bad=True, now=3.0)  # retried on the next reading
    assert tracker.blocked(GPU) is False  # ... without a second report


def _pod(name: str, cls: str, bind_minute: int, **extra: str) -> PodFacts:
    placement = Placement((GPU,), 30, 2**30, T0 + timedelta(minutes=bind_minute), "allocated")
    return facts(
        {
            "metadata": {
                "name": name,
                "namespace": "ml",
                "creationTimestamp": T0.isoformat(),
                "annotations": {ANN_CLASS: cls, **placement.to_annotations(), **extra},
            },
            "spec": {
                "nodeName": "n1",
                "containers": [
                    {"name": "c", "resources": {"limits": {RESOURCE_GPU_PERCENT: "30"}}}
                ],
            },
            "status": {"phase": "Running"},
        }
    )


def test_victim_is_the_most_recently_placed_batch_pod() -> None:
    tenants = [
        _pod("infer", "latency", 9),
        _pod("train-old", "batch", 1),
        _pod("train-new", "batch", 5),
        _pod("profiling", "batch", 7, **{ANN_PROFILING: "true"}),
    ]
    victim = choose_victim(tenants)
    assert victim is not None and victim.name == "train-new"


def test_no_victim_when_only_latency_pods_share_the_gpu() -> None:
    assert choose_victim([_pod("a", "latency", 1), _pod("b", "latency", 2)]) is None


def test_predictor_uses_measured_profiles_and_ignores_unprofiled_neighbours() -> None:
    view = ClusterView()
    base = {"gpuModel": "NVIDIA H200", "time": "2025-03-01T00:00:00Z"}
    light = json.dumps(
        {**base, "fp32": 0.08, "tensor": 0.22, "smOccupancy": 0.3, "dramBandwidth": 0.15}
    )
    heavy = json.dumps(
        {**base, "fp32": 0.3, "tensor": 0.95, "smOccupancy": 0.95, "dramBandwidth": 0.7}
    )
    infer = _pod("infer", "latency", 1, **{ANN_PROFILE: light})
    trainer = _pod("train", "batch", 2, **{ANN_PROFILE: heavy})
    small = _pod("small", "batch", 2, **{ANN_PROFILE: light})
    unknown = _pod("unknown", "batch", 3)
    predict = interference_predictor(view, load_default())
    alone = predict(infer, [unknown])
    beside_heavy = predict(infer, [trainer])
    beside_light = predict(infer, [small])
    assert alone == 1.0  # nothing measured next to it: no evidence of interference
    assert beside_heavy is not None and beside_light is not None
    # Caps that split the GPU leave only DRAM to tell these two apart, and the H200 fit with
    # cap_relief gives dram_contention no weight: equal is what the model says.
    assert beside_heavy >= beside_light >= 1.0
    assert predict(unknown, [infer]) is None
