"""How well gpushare's interference model predicts packs it was not fit on.

Three measures on one run's measured packs (``colocations.json`` records, slowdown relative to
the job alone at the same cap, as the model defines it):

- ``shipped``: the shipped model (``gpushare/packing/data/interference.json``, fit before the
  run) on the packs of the kinds it was fit on -- repeatability, and on another GPU model
  transfer -- and on the packs holding a kind it never saw (``catalog.UNSEEN_KINDS``: built
  from transformers and torchvision, in no fit): the generalisation target;
- ``leave_one_kind_out``: for each kind, the model refit on the run's packs without that kind
  predicts the packs with it, pooled over kinds;
- ``k_fold``: the run's packs 5-fold by pack (``colocate.held_out_mape``), for comparison with
  the earlier runs;
- ``calibrated``: the shipped model refined on this GPU's packs of the kinds it was fit on by
  the product's ``gpushare.packing.calibration.calibrate`` (what a platform team gets by
  measuring a few packs on its own GPUs, docs/packing.md "Calibrating on your GPUs"), on the
  packs holding an unseen kind: those never enter a fit.

:func:`pair_throughput` says, from the model, whether two jobs get more done together than one
after the other.
"""

from collections.abc import Iterable, Sequence
from typing import Any

from bench.gpu.colocate import Predictor, Record
from bench.gpu.fitting import (
    ColocationRecord,
    fit_coefficients,
    observations,
    parse_records,
    relative_errors,
)
from gpushare.packing.calibration import calibrate
from gpushare.packing.interference import InterferenceModel, load_default
from gpushare.packing.model import PipeProfile


def errors(model: InterferenceModel, records: Iterable[ColocationRecord]) -> list[float]:
    """Relative error of the same-cap slowdown of every job with both rates."""
    return relative_errors(model, list(records), same_cap=True)


def _mape(errs: Sequence[float]) -> float | None:
    return round(sum(errs) / len(errs), 4) if errs else None


def kinds_of(record: ColocationRecord) -> set[str]:
    return {j.name for j in record.jobs}


def shipped(data: Sequence[Record], *, unseen: Iterable[str]) -> dict[str, Any]:
    """The shipped model on the run's packs: of fitted kinds only, and holding an unseen kind
    (per unseen kind too)."""
    records = parse_records(list(data), origin="colocations")
    new = set(unseen)
    model = load_default()
    known = [r for r in records if not kinds_of(r) & new]
    fresh = [r for r in records if kinds_of(r) & new]
    by_kind = {
        k: _mape(errors(model, [r for r in fresh if k in kinds_of(r)]))
        for k in sorted(new)
        if any(k in kinds_of(r) for r in fresh)
    }
    known_errs, fresh_errs = errors(model, known), errors(model, fresh)
    return {
        "fitted_kinds_mape": _mape(known_errs),
        "fitted_kinds_predictions": len(known_errs),
        "unseen_kinds_mape": _mape(fresh_errs),
        "unseen_kinds_predictions": len(fresh_errs),
        "unseen_by_kind": by_kind,
    }


def calibrated(data: Sequence[Record], *, unseen: Iterable[str]) -> dict[str, Any]:
    """The shipped model calibrated on the run's packs of known kinds only, on the packs that
    hold an unseen kind (per unseen kind too), with the calibrated coefficients."""
    records = parse_records(list(data), origin="colocations")
    new = set(unseen)
    known = [r for r in records if not kinds_of(r) & new]
    fresh = [r for r in records if kinds_of(r) & new]
    model = calibrate(load_default(), observations(known))
    errs = errors(model, fresh)
    return {
        "calibrated_on_packs": len(known),
        "calibrated_on_predictions": len(observations(known)),
        "unseen_kinds_mape": _mape(errs),
        "unseen_kinds_predictions": len(errs),
        "unseen_by_kind": {
            k: _mape(errors(model, [r for r in fresh if k in kinds_of(r)]))
            for k in sorted(new)
            if any(k in kinds_of(r) for r in fresh)
        },
        "coefficients": dict(
            zip(model.feature_names, (round(c, 4) for c in model.coefficients), strict=True)
        ),
        "by": "gpushare.packing.calibration.calibrate (prior: the shipped model)",
    }


def leave_one_kind_out(data: Sequence[Record]) -> dict[str, Any]:
    """Pooled MAPE over kinds of a model refit without each kind's packs, predicting them."""
    records = parse_records(list(data), origin="colocations")
    kinds = sorted({k for r in records for k in kinds_of(r)})
    pooled: list[float] = []
    by_kind: dict[str, float | None] = {}
    for kind in kinds:
        test = [r for r in records if kind in kinds_of(r)]
        train = [r for r in records if kind not in kinds_of(r)]
        if not train or not test:
            continue
        model = InterferenceModel(coefficients=fit_coefficients(train, cap_term=False))
        errs = errors(model, test)
        by_kind[kind] = _mape(errs)
        pooled += errs
    return {"mape": _mape(pooled), "predictions": len(pooled), "by_kind": by_kind}


def predict_retained(model: InterferenceModel, pack: Record) -> list[float]:
    """Predicted colocated rate / solo rate at the same cap of each job of a pack."""
    jobs = parse_records([pack], origin="colocations")[0].jobs
    return [1.0 / s for s in model.predict_pack([(j.profile, j.thread_percent) for j in jobs])]


def fitter(train: list[Record]) -> Predictor:
    """A model refit on ``train`` (for ``colocate.held_out_mape``)."""
    model = InterferenceModel(
        coefficients=fit_coefficients(parse_records(train, origin="colocations"), cap_term=False)
    )
    return lambda pack: predict_retained(model, pack)


def pair_throughput(
    model: InterferenceModel,
    first: tuple[PipeProfile, int],
    second: tuple[PipeProfile, int],
) -> float:
    """Work two jobs finish per second when run together, in units of one job alone on the
    whole GPU: ``1 / slowdown`` of each vs the whole GPU, summed (1.0 = no better than one
    after the other). On an H200, ResNet-50 and a transformer at 100/100 threads measured 1.10
    (predicted 1.09); an FP64 GEMM beside anything about 1.0 at best."""
    pack = model.predict_pack([first, second])
    return sum(
        1.0 / (s * model.cap_slowdown(profile, threads))
        for s, (profile, threads) in zip(pack, (first, second), strict=True)
    )
