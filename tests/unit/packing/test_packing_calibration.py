"""Calibrating the interference model on colocations measured on one's own GPUs, and loading
a calibrated model file in place of the shipped one."""

import json
import math
import re
from pathlib import Path

import pytest

from bench.gpu.fitting import fit, observations, parse_records
from bench.sim.fit_interference import main as fit_interference
from gpushare.api.errors import InvalidInputError
from gpushare.packing.calibration import Observation, anchored_nnls, calibrate
from gpushare.packing.interference import MODEL_ENV, InterferenceModel, load_default
from gpushare.packing.model import PipeProfile
from tests import REPO

GEMM = PipeProfile(tensor=0.96, sm_occupancy=0.12, dram_bandwidth=0.15, sm_utilization=0.97)
RESNET18 = PipeProfile(
    fp32=0.01, tensor=0.02, sm_occupancy=0.05, dram_bandwidth=0.04, sm_utilization=0.16
)
RESNET50 = PipeProfile(
    fp32=0.03, tensor=0.10, sm_occupancy=0.48, dram_bandwidth=0.50, sm_utilization=0.83
)


def starved(slowdown: float) -> list[Observation]:
    return [
        Observation(RESNET18, 100, ((GEMM, 100),), slowdown),
        Observation(RESNET50, 100, ((GEMM, 100),), slowdown * 1.5),
    ]


def test_no_observations_give_the_prior_back() -> None:
    prior = load_default()
    assert calibrate(prior, []) is prior
    # Jobs measured alone say nothing about neighbours.
    assert calibrate(prior, [Observation(RESNET18, 100, (), 1.0)]) is prior


def test_a_host_where_a_gemm_starves_less_lowers_that_prediction() -> None:
    # The shipped model (fit where a GEMM cost 12-60x) predicts far more than this host's 15x.
    prior = load_default()
    before = prior.predict(RESNET18, 100, [(GEMM, 100)])
    model = calibrate(prior, starved(15.0) * 3)
    after = model.predict(RESNET18, 100, [(GEMM, 100)])
    assert before > 30
    assert abs(after - 15.0) < abs(before - 15.0) / 2
    assert model.mape_in_sample is not None and model.mape_in_sample < 0.5
    assert "calibrated" in model.source and "6 observations" in model.source


def test_the_prior_weight_decides_how_far_the_model_moves() -> None:
    prior = load_default()
    few = calibrate(prior, starved(15.0), prior_weight=100.0)
    many = calibrate(prior, starved(15.0), prior_weight=0.01)
    target = 15.0
    assert abs(many.predict(RESNET18, 100, [(GEMM, 100)]) - target) < abs(
        few.predict(RESNET18, 100, [(GEMM, 100)]) - target
    )


def test_a_feature_the_observations_never_exercise_keeps_its_prior_value() -> None:
    # Two light jobs side by side: no pipe is saturated, so starvation stays as shipped.
    prior = load_default()
    obs = [Observation(RESNET18, 100, ((RESNET18, 100),), 1.2)] * 4
    model = calibrate(prior, obs)
    at = prior.feature_names.index("starvation")
    assert math.isclose(model.coefficients[at], prior.coefficients[at], rel_tol=1e-6)
    # The thread cap's own cost is never touched by same-cap colocations.
    assert model.coefficients[-1] == prior.coefficients[-1]


def test_coefficients_stay_non_negative() -> None:
    # Two light jobs that ran *faster* together (noise) cannot make contention speed jobs up.
    obs = [Observation(RESNET18, 100, ((RESNET50, 100),), 0.5)] * 10
    model = calibrate(load_default(), obs, prior_weight=0.0)
    assert all(c >= 0 for c in model.coefficients)
    assert model.predict(RESNET18, 100, [(RESNET50, 100)]) >= 1.0


def test_anchored_least_squares_pulls_toward_the_prior() -> None:
    rows = [((1.0, 0.0), 2.0), ((1.0, 0.0), 2.0)]
    free = anchored_nnls(rows, [0.0, 0.0], [1e-9, 1e-9])
    anchored = anchored_nnls(rows, [0.0, 3.0], [2.0, 2.0])
    assert free[0] == pytest.approx(2.0, rel=1e-6)
    assert anchored[0] == pytest.approx(1.0)  # halfway: two observations against weight 2
    assert anchored[1] == pytest.approx(3.0)  # unexercised: the prior's value


@pytest.mark.parametrize(
    ("obs", "field"),
    [
        (Observation(RESNET18, 100, ((GEMM, 100),), 0.0), "observations[0].slowdown"),
        (Observation(RESNET18, 100, ((GEMM, 100),), math.nan), "observations[0].slowdown"),
    ],
)
def test_bad_observations_are_refused_naming_the_field(obs: Observation, field: str) -> None:
    with pytest.raises(InvalidInputError, match=re.escape(field)):
        calibrate(load_default(), [obs])
    with pytest.raises(InvalidInputError, match="prior_weight"):
        calibrate(load_default(), [], prior_weight=-1)


def test_calibrating_on_a_hosts_known_kinds_predicts_its_unseen_kinds_better() -> None:
    # Run 11 on an H100 (bench/gpu/data): the shipped model on packs holding GPT-2, BERT or
    # ViT erred by 27%; refined on the same GPU's packs of the other kinds, by far less.
    data = json.loads((REPO / "bench/gpu/data/run11-h100-colocations.json").read_text())
    records = parse_records(data)
    unseen = {"gpt2", "bert", "vit"}
    known = [r for r in records if not {j.name for j in r.jobs} & unseen]
    fresh = observations([r for r in records if {j.name for j in r.jobs} & unseen])

    def mape(model_obs: list[Observation], model: InterferenceModel) -> float:
        errs = [
            abs(model.predict(o.target, o.threads, list(o.neighbours)) - o.slowdown) / o.slowdown
            for o in model_obs
        ]
        return sum(errs) / len(errs)

    # Fit as the model shipped until run 13 was: on H200 runs 5 + 7 + 8, never on this host.
    before = fit(
        [
            r
            for name in ("colocations.json", "run7-colocations.json", "run8-colocations.json")
            for r in parse_records(json.loads((REPO / "bench/gpu/data" / name).read_text()))
        ]
    )
    shipped = mape(fresh, before)
    calibrated = mape(fresh, calibrate(before, observations(known)))
    assert shipped > 0.25
    assert calibrated < shipped * 0.7


def test_a_model_file_named_in_the_environment_replaces_the_shipped_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calibrated = calibrate(load_default(), starved(15.0))
    path = tmp_path / "calibrated.json"
    path.write_text(json.dumps(calibrated.to_dict()))
    load_default.cache_clear()
    try:
        monkeypatch.setenv(MODEL_ENV, str(path))
        assert load_default().coefficients == pytest.approx(calibrated.coefficients, abs=1e-6)
        monkeypatch.setenv(MODEL_ENV, str(tmp_path / "missing.json"))
        load_default.cache_clear()
        with pytest.raises(InvalidInputError, match=MODEL_ENV):
            load_default()
        path.write_text("[1, 2]")
        monkeypatch.setenv(MODEL_ENV, str(path))
        load_default.cache_clear()
        with pytest.raises(InvalidInputError, match="not a JSON object"):
            load_default()
    finally:
        monkeypatch.delenv(MODEL_ENV)
        load_default.cache_clear()
    assert "H200" in load_default().source


def test_the_calibrate_command_writes_a_model_the_controller_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "calibrated.json"
    data = str(REPO / "bench/gpu/data/run13-h200-colocations.json")
    # --calibrate never overwrites the shipped file: --output is required.
    with pytest.raises(SystemExit):
        fit_interference(["--calibrate", data])
    assert "--output" in capsys.readouterr().err
    assert fit_interference(["--calibrate", data, "--output", str(out)]) == 0
    load_default.cache_clear()
    try:
        monkeypatch.setenv(MODEL_ENV, str(out))
        model = load_default()
        assert model.source.startswith("calibrated:")
    finally:
        monkeypatch.delenv(MODEL_ENV)
        load_default.cache_clear()
    assert model.coefficients != load_default().coefficients


def test_a_refit_can_keep_kinds_unseen(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Fitting on a run's packs but leaving out those holding the kinds the GPU benchmark tests
    # generalisation on: the model file says which, and fewer packs went in.
    data = str(REPO / "bench/gpu/data/run13-h200-colocations.json")
    all_packs, kept = tmp_path / "all.json", tmp_path / "kept.json"
    assert fit_interference([data, "--output", str(all_packs)]) == 0
    unseen = ["--exclude-kind", "gpt2", "--exclude-kind", "bert", "--exclude-kind", "vit"]
    assert fit_interference([data, *unseen, "--output", str(kept)]) == 0
    full, partial = json.loads(all_packs.read_text()), json.loads(kept.read_text())
    assert "left out" not in full["source"]
    assert "packs holding bert, gpt2, vit left out" in partial["source"]
    assert partial["records"] < full["records"]
    capsys.readouterr()
