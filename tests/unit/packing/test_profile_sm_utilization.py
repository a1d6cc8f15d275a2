"""SM utilization travels from the node agent's /profile answer to the extender's policy.

The interference model packs launch-bound jobs (SMs mostly idle) by their measured SM
utilization; if any hop dropped it, the cluster would treat every job as filling its thread
cap and pack less than the benchmarks measured.
"""

import json
from datetime import UTC, datetime

import yaml

from gpushare.api.gpushare_crd import ANN_PROFILE
from gpushare.api.profile import GpuProfile
from gpushare.cluster.operator.readings import parse_reading
from gpushare.cluster.state.share_rules import rules_of
from gpushare.node.exporter.profiler import pipe_profile_from_json
from gpushare.packing.interference import load_default
from gpushare.packing.model import PipeProfile
from tests import REPO

CRD_PATHS = [
    REPO / "crds" / "gpushare.io_gpushares.yaml",
    REPO / "helm" / "gpushare" / "crds" / "gpushare.io_gpushares.yaml",
]
AGENT_ANSWER = {
    "gpu_model": "NVIDIA H200",
    "sampled_seconds": 30.0,
    "simulated": False,
    "fp16": 0.0,
    "fp32": 0.02,
    "fp64": 0.0,
    "tensor": 0.05,
    "sm_occupancy": 0.12,
    "sm_utilization": 0.38,
    "dram_bandwidth": 0.07,
    "memory_used_bytes_max": 2_000_000_000,
}


def test_profile_annotation_written_by_the_operator_keeps_sm_utilization_for_the_extender() -> None:
    stored = parse_reading(AGENT_ANSWER).stored(now=datetime(2026, 11, 1, tzinfo=UTC))
    annotation = json.dumps(stored.to_status(), separators=(",", ":"))
    assert json.loads(annotation)["smUtilization"] == 0.38
    rules = rules_of(name="p", namespace="ns", annotations={ANN_PROFILE: annotation})
    assert rules.profile is not None and rules.profile.sm_utilization == 0.38
    assert GpuProfile.from_status(stored.to_status()) == stored


def test_profiles_stored_before_the_field_existed_still_read_as_unknown() -> None:
    old = {
        "gpuModel": "NVIDIA H200",
        "fp32": 0.5,
        "sampledSeconds": 30,
        "time": "2026-11-01T00:00:00Z",
    }
    stored = GpuProfile.from_status(old)
    assert isinstance(stored, GpuProfile) and stored.sm_utilization is None
    rules = rules_of(name="p", namespace="ns", annotations={ANN_PROFILE: json.dumps(old)})
    assert rules.profile is not None and rules.profile.sm_utilization is None


def test_the_profiler_answer_gives_the_policy_its_sm_utilization() -> None:
    assert pipe_profile_from_json(AGENT_ANSWER).sm_utilization == 0.38
    without = {k: v for k, v in AGENT_ANSWER.items() if k != "sm_utilization"}
    assert pipe_profile_from_json(without).sm_utilization is None


def test_the_crd_stores_sm_utilization_in_status_instead_of_pruning_it() -> None:
    for path in CRD_PATHS:
        (version,) = yaml.safe_load(path.read_text())["spec"]["versions"]
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        profile = status["properties"]["profile"]["properties"]
        assert profile["smUtilization"]["maximum"] == 1, path


def test_a_measured_launch_bound_neighbour_is_predicted_to_interfere_less() -> None:
    model = load_default()
    target = PipeProfile(
        fp32=0.3, tensor=0.3, sm_occupancy=0.4, dram_bandwidth=0.3, sm_utilization=0.8
    )
    busy = PipeProfile(fp32=0.05, tensor=0.05, sm_occupancy=0.12, dram_bandwidth=0.07)
    idle_sms = PipeProfile(
        fp32=0.05, tensor=0.05, sm_occupancy=0.12, dram_bandwidth=0.07, sm_utilization=0.2
    )
    unknown = model.predict(target, 100, [(busy, 50)])
    measured = model.predict(target, 100, [(idle_sms, 50)])
    assert measured < unknown
