"""GpuShare spec/status parsing: what the operator accepts, and the errors users read."""

import json
from datetime import UTC, datetime

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.api.gpushare_crd import (
    ANN_MAX_PODS_PER_GPU,
    ANN_PACKING_POLICY,
    ANN_PROFILE,
    ANN_PROFILING,
    PHASE_PACKED,
    PHASE_PENDING,
    PHASE_PROFILING,
    inherited_annotations,
    linked_share,
    missing_annotations,
    parse_profile_annotation,
    parse_spec,
    profile_annotation,
    scheduling_hold,
    selector_matches,
)
from gpushare.api.names import ANN_CLASS, ANN_FRACTION, ANN_MEMORY, ANN_SHARE
from gpushare.api.profile import GpuProfile


def test_full_spec_parses_with_units_and_defaults() -> None:
    spec = parse_spec(
        {
            "fraction": "25%",
            "memory": "10Gi",
            "class": "latency",
            "selector": {"matchLabels": {"app": "infer"}},
            "packing": {"policy": "exclusive", "maxPodsPerGpu": 4},
        }
    )
    assert spec.percent == 25
    assert spec.memory_bytes == 10 * 2**30
    assert spec.gpu_class == "latency"
    assert spec.profiling.mode == "auto"
    assert spec.profiling.window_seconds == 60
    assert spec.packing.policy == "exclusive"
    assert spec.packing.max_pods_per_gpu == 4


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({}, "spec.fraction", "is required"),
        ({"fraction": "1.5"}, "spec.fraction", "more than one GPU"),
        ({"fraction": "2"}, "spec.fraction", "at most two decimals"),
        ({"fraction": "0.125"}, "spec.fraction", "at most two decimals"),
        ({"fraction": "0"}, "spec.fraction", "greater than 0"),
        ({"fraction": "0.5", "memory": "lots"}, "spec.memory", "not a memory quantity"),
        ({"fraction": "0.5", "class": "urgent"}, "spec.class", "latency, batch"),
        ({"fraction": "0.5", "profiling": {"mode": "sometimes"}}, "spec.profiling.mode", "auto"),
        (
            {"fraction": "0.5", "profiling": {"windowSeconds": 5}},
            "spec.profiling.windowSeconds",
            "10 to 3600",
        ),
        (
            {"fraction": "0.5", "packing": {"maxPodsPerGpu": 49}},
            "spec.packing.maxPodsPerGpu",
            "1 to 48",
        ),
        (
            {"fraction": "0.5", "class": "latency", "packing": {"policy": "aggressive"}},
            "spec.packing.policy",
            "cautious or exclusive",
        ),
        ({"fraction": "0.5", "selector": {}}, "spec.selector", "every pod"),
        (
            {"fraction": "0.5", "selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
            "spec.selector.matchExpressions[0].values",
            "must not be empty",
        ),
    ],
)
def test_bad_spec_names_the_field_and_the_fix(
    spec: dict[str, object], field: str, words: str
) -> None:
    with pytest.raises(InvalidInputError) as err:
        parse_spec(spec)
    assert err.value.field == field
    assert words in str(err.value)
    assert err.value.fix


def test_selector_matches_like_kubernetes_but_empty_matches_nothing() -> None:
    spec = parse_spec(
        {
            "fraction": "0.5",
            "selector": {
                "matchLabels": {"app": "train"},
                "matchExpressions": [
                    {"key": "tier", "operator": "NotIn", "values": ["debug"]},
                    {"key": "team", "operator": "Exists"},
                ],
            },
        }
    )
    assert spec.selector is not None
    assert spec.selector.matches({"app": "train", "team": "a"})
    assert not spec.selector.matches({"app": "train", "team": "a", "tier": "debug"})
    assert not spec.selector.matches({"app": "train"})
    assert not spec.selector.matches({"app": "infer", "team": "a"})


def test_only_the_annotation_links_and_selectors_are_listed_as_matches() -> None:
    """A share's selector links a pod only at creation (the webhook writes the annotation):
    governance reads the annotation alone, so a label added later moves nothing."""
    train = parse_spec({"fraction": "0.5", "selector": {"matchLabels": {"app": "train"}}})
    also = parse_spec({"fraction": "0.3", "selector": {"matchLabels": {"app": "train"}}})
    shares = [("zeta", train), ("alpha", also), ("broken", None)]
    assert linked_share({}) is None
    assert linked_share({ANN_SHARE: " mine "}) == "mine"
    assert selector_matches(shares, labels={"app": "train"}) == ["alpha", "zeta"]
    assert selector_matches(shares, labels={"app": "web"}) == []


def test_governed_pod_inherits_the_request_but_keeps_its_own_values() -> None:
    spec = parse_spec(
        {
            "fraction": "0.3",
            "memory": "8Gi",
            "class": "latency",
            "packing": {"policy": "cautious", "maxPodsPerGpu": 3},
        }
    )
    wanted = inherited_annotations(spec, share_name="infer")
    assert wanted == {
        ANN_SHARE: "infer",
        ANN_FRACTION: "0.3",
        ANN_MEMORY: "8Gi",
        ANN_CLASS: "latency",
        ANN_PACKING_POLICY: "cautious",
        ANN_MAX_PODS_PER_GPU: "3",
    }
    own = {ANN_FRACTION: "0.5", ANN_SHARE: "infer"}
    missing = missing_annotations(spec, share_name="infer", annotations=own)
    assert ANN_FRACTION not in missing and ANN_SHARE not in missing
    assert missing[ANN_MEMORY] == "8Gi"
    assert missing_annotations(spec, share_name="infer", annotations=wanted) == {}


def test_only_the_profiling_pod_is_scheduled_until_the_share_is_packed() -> None:
    linked = {ANN_SHARE: "job"}
    elected = {ANN_SHARE: "job", ANN_PROFILING: "true"}
    pending = {"phase": PHASE_PENDING}
    profiling = {"phase": PHASE_PROFILING, "profilingPod": "job-0"}
    assert "electing" in (
        scheduling_hold(pod_name="job-1", pod_annotations=linked, share_status=pending) or ""
    )
    assert scheduling_hold(pod_name="job-0", pod_annotations=elected, share_status=pending) is None
    assert "profiling" in (
        scheduling_hold(pod_name="job-1", pod_annotations=linked, share_status=profiling) or ""
    )
    assert scheduling_hold(pod_name="job-0", pod_annotations=linked, share_status=profiling) is None
    packed = {"phase": PHASE_PACKED}
    assert scheduling_hold(pod_name="job-1", pod_annotations=linked, share_status=packed) is None


def test_profile_round_trips_through_status_and_pod_annotation() -> None:
    profile = GpuProfile(
        gpu_model="NVIDIA H200",
        fp16=0.02,
        fp32=0.05,
        fp64=None,
        tensor=0.78,
        sm_occupancy=0.61,
        dram_bandwidth=0.4,
        memory_used_bytes_max=12 * 2**30,
        sampled_seconds=60.0,
        time=datetime(2025, 3, 1, 12, 0, tzinfo=UTC),
        simulated=False,
    )
    status = profile.to_status()
    assert "fp64" not in status  # unmeasured stays absent, never 0
    assert GpuProfile.from_status(status) == profile
    assert parse_profile_annotation(profile_annotation(status)) == profile


def test_damaged_profile_annotation_names_the_annotation() -> None:
    with pytest.raises(InvalidInputError) as err:
        parse_profile_annotation("{not json")
    assert err.value.field == ANN_PROFILE
    bad = json.dumps({"gpuModel": "H200", "tensor": 1.7, "time": "2025-03-01T00:00:00Z"})
    with pytest.raises(InvalidInputError) as err:
        parse_profile_annotation(bad)
    assert err.value.field == f"{ANN_PROFILE}.tensor"
