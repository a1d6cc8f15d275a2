"""The colocated-slowdown model: predictions, fitting, the shipped default, admission."""

import json
import math
from pathlib import Path

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.packing.interference import (
    FEATURE_NAMES,
    ColocationJob,
    ColocationRecord,
    InterferenceModel,
    admit_reason,
    fit,
    load_default,
    parse_records,
)
from gpushare.packing.model import Demand, GpuState, PipeProfile, Tenant

REPO = Path(__file__).resolve().parents[2]
# Solo H200 GPM profiles as the GPU benchmark measured them.
FP64_GEMM = PipeProfile(tensor=0.97, sm_occupancy=0.12, dram_bandwidth=0.11)
RESNET18 = PipeProfile(fp32=0.015, tensor=0.048, sm_occupancy=0.12, dram_bandwidth=0.07)
FP32_GEMM = PipeProfile(fp32=0.77, sm_occupancy=0.95, dram_bandwidth=0.25)
INFERENCE = PipeProfile(tensor=0.15, fp32=0.05, sm_occupancy=0.3, dram_bandwidth=0.15)
LIGHT = PipeProfile(fp32=0.05, sm_occupancy=0.08, dram_bandwidth=0.03)


def test_alone_means_no_slowdown() -> None:
    assert load_default().predict(FP64_GEMM, 100, []) == 1.0


def test_heavier_neighbours_slow_a_job_more() -> None:
    model = load_default()
    light = model.predict(INFERENCE, 100, [(LIGHT, 100)])
    heavy = model.predict(INFERENCE, 100, [(FP32_GEMM, 100)])
    two_heavy = model.predict(INFERENCE, 100, [(FP32_GEMM, 100), (FP64_GEMM, 100)])
    assert 1.0 <= light < heavy < two_heavy


def test_light_job_beside_an_uncapped_fp64_gemm_crawls_but_not_under_split_caps() -> None:
    # Measured on an H200: ResNet-18 beside an uncapped FP64 GEMM ran 44x slower, the GEMM
    # itself ~1.0x; at 50/50 thread caps the pair ran 1.17x / 1.08x.
    model = load_default()
    assert model.predict(RESNET18, 100, [(FP64_GEMM, 100)]) > 10.0
    assert model.predict(FP64_GEMM, 100, [(RESNET18, 100)]) < 1.5
    assert model.predict(RESNET18, 50, [(FP64_GEMM, 50)]) < 1.5


def test_thread_caps_that_split_the_gpu_shrink_predicted_interference() -> None:
    model = load_default()
    uncapped = model.predict(INFERENCE, 100, [(FP32_GEMM, 100)])
    split = model.predict(INFERENCE, 60, [(FP32_GEMM, 40)])
    assert split < uncapped


def test_shipped_default_says_where_it_came_from_and_how_accurate_it_is() -> None:
    model = load_default()
    assert model.feature_names == FEATURE_NAMES
    assert model.source.startswith("measured:")
    assert model.mape_held_out is not None and model.mape_held_out < 0.25
    assert all(c >= 0 for c in model.coefficients)


def _synthetic_records(coefficients: tuple[float, ...]) -> list[ColocationRecord]:
    truth = InterferenceModel(coefficients=coefficients)
    profiles = [FP64_GEMM, FP32_GEMM, INFERENCE, LIGHT, PipeProfile(fp16=0.4, sm_occupancy=0.5)]
    records = []
    for i, a in enumerate(profiles):
        for b in profiles[i:]:
            for ta, tb in ((100, 100), (60, 40), (50, 50)):
                jobs = []
                for me, mine, other, theirs in ((a, ta, b, tb), (b, tb, a, ta)):
                    slowdown = truth.predict_vs_full_gpu(me, mine, [(other, theirs)])
                    jobs.append(ColocationJob("j", me, mine, 1.0, 1.0 / slowdown))
                records.append(ColocationRecord("H100", tuple(jobs)))
    return records


def test_fit_recovers_the_model_that_generated_the_data() -> None:
    coefficients = (0.9, 0.3, 0.5, 1.2, 0.4, 0.7)
    model = fit(_synthetic_records(coefficients), source="synthetic")
    assert model.coefficients == pytest.approx(coefficients, abs=1e-6)
    assert model.mape_in_sample == pytest.approx(0.0, abs=1e-9)
    assert model.mape_held_out == pytest.approx(0.0, abs=1e-6)


def test_fit_never_returns_a_negative_coefficient() -> None:
    # Measured speedups beside a neighbour (noise) must not teach "contention helps".
    records = _synthetic_records((0.9, 0.0, 0.5, 1.2, 0.0, 0.3))
    noisy = [
        ColocationRecord(
            r.gpu,
            tuple(ColocationJob(j.name, j.profile, j.thread_percent, 1.0, 1.1) for j in r.jobs),
        )
        for r in records[:3]
    ]
    model = fit(records + noisy)
    assert all(c >= 0 for c in model.coefficients)


def test_seed_records_still_fit_as_a_fallback() -> None:
    raw = json.loads((REPO / "bench/sim/data/seed_colocations.json").read_text())
    model = fit(parse_records(raw))
    assert all(c >= 0 for c in model.coefficients)
    assert model.mape_in_sample is not None and model.mape_in_sample < 0.3


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"gpu": "H100"}, "colocations"),
        ([{"gpu": "H100"}], "colocations[0]"),
        ([{"jobs": [{"profile": {"fp32": 1.5}}]}], "colocations[0].jobs[0].profile.fp32"),
        (
            [{"jobs": [{"profile": {}, "solo_rate": "fast"}]}],
            "colocations[0].jobs[0].solo_rate",
        ),
        (
            [{"jobs": [{"profile": {}, "thread_percent": 0}]}],
            "colocations[0].jobs[0].thread_percent",
        ),
    ],
)
def test_bad_colocation_data_names_the_field(raw: object, field: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        parse_records(raw)
    assert err.value.field == field


def test_model_file_with_other_features_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="feature_names"):
        InterferenceModel.from_dict({"feature_names": ["x"], "coefficients": [1.0]})


BOUNDS = {"latency": 1.15, "batch": 2.0}


def _gpu(*tenants: Tenant) -> GpuState:
    return GpuState("g0", 80 << 30, model="H100", tenants=list(tenants))


def test_latency_pod_refused_next_to_a_predicted_heavy_neighbour() -> None:
    gpu = _gpu(Tenant("ns/train", 60, 40 << 30, profile=FP32_GEMM, thread_percent=100))
    demand = Demand(percent=30, gpu_class="latency", profile=INFERENCE)
    reason = admit_reason(gpu, demand, model=load_default(), bounds=BOUNDS)
    assert reason is not None and "latency pod" in reason and "1.15x bound" in reason


def test_latency_pod_admitted_next_to_a_light_neighbour() -> None:
    gpu = _gpu(Tenant("ns/etl", 30, 20 << 30, profile=LIGHT))
    demand = Demand(percent=30, gpu_class="latency", profile=INFERENCE)
    assert admit_reason(gpu, demand, model=load_default(), bounds=BOUNDS) is None


def test_batch_pod_refused_when_it_would_push_a_latency_tenant_past_its_bound() -> None:
    # An uncapped latency tenant shares its SMs with whoever comes: an FP64 GEMM would starve it.
    web = Tenant("ns/web", 40, 30 << 30, gpu_class="latency", profile=RESNET18, thread_percent=100)
    reason = admit_reason(_gpu(web), Demand(percent=60, profile=FP64_GEMM), model=load_default(),
                          bounds=BOUNDS)  # fmt: skip
    assert reason is not None and "ns/web" in reason
    # Capped to its share, it keeps its own SMs and the GEMM may come.
    capped = Tenant("ns/web", 40, 30 << 30, gpu_class="latency", profile=RESNET18)
    assert (
        admit_reason(
            _gpu(capped), Demand(percent=60, profile=FP64_GEMM), model=load_default(), bounds=BOUNDS
        )
        is None
    )


def test_unprofiled_neighbour_is_assumed_heavy() -> None:
    gpu = _gpu(Tenant("ns/unknown", 30, 20 << 30, thread_percent=100))
    demand = Demand(percent=30, gpu_class="latency", profile=INFERENCE)
    assert admit_reason(gpu, demand, model=load_default(), bounds=BOUNDS) is not None


def test_explain_adds_up_to_the_prediction() -> None:
    model = load_default()
    parts = model.explain(INFERENCE, 100, [(FP32_GEMM, 100)])
    assert set(parts) == set(FEATURE_NAMES)
    assert math.exp(sum(parts.values())) == pytest.approx(
        model.predict(INFERENCE, 100, [(FP32_GEMM, 100)])
    )
