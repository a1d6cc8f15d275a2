"""Fitting gpushare's interference model to measured colocations, and scoring a fit.

The model itself, its features and the shipped coefficients live in
:mod:`gpushare.packing.interference`; this is what makes and checks those coefficients: the
colocation records (``bench/gpu/data/colocations.json``, format in :mod:`bench.gpu.colocate`),
a non-negative least squares on ``ln(slowdown)`` (:func:`fit`), and its errors in-sample and
held out (:func:`mape`, :func:`held_out_mape`). ``bench/sim/fit_interference.py`` writes the
shipped file with it; ``bench/gpu/model_eval.py`` refits per kind. How well it does:
docs/packing.md, "The interference model".
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import SLICES_PER_GPU
from gpushare.api.profile import PLACEMENT_COUNTERS
from gpushare.packing.calibration import Observation, solve
from gpushare.packing.interference import (
    COLOCATION_FEATURES,
    FEATURE_NAMES,
    InterferenceModel,
    cap_feature,
    features,
)
from gpushare.packing.model import PipeProfile
from gpushare.packing.stored_profile import counters_pipe_profile


@dataclass(frozen=True)
class ColocationJob:
    """One job of a measured colocation. Rates are work per second; None = not measured."""

    name: str
    profile: PipeProfile
    thread_percent: int = SLICES_PER_GPU
    solo_rate: float | None = None
    """Rate alone on the GPU at 100% threads."""
    colocated_rate: float | None = None

    @property
    def slowdown(self) -> float | None:
        if self.solo_rate is None or self.colocated_rate is None:
            return None
        return self.solo_rate / self.colocated_rate


@dataclass(frozen=True)
class ColocationRecord:
    """Jobs that ran together on one GPU (``bench/gpu/data/colocations.json`` is a list)."""

    gpu: str
    jobs: tuple[ColocationJob, ...] = field(default_factory=tuple)


def _number(value: object, where: str, *, low: float, high: float | None = None) -> float:
    fix = f"write a number >= {low}" + (f" and <= {high}" if high is not None else "")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(where, f"{value!r} is not a number", fix)
    number = float(value)
    if not math.isfinite(number) or number < low or (high is not None and number > high):
        raise InvalidInputError(where, f"{value!r} is out of range", fix)
    return number


def parse_records(raw: object, *, origin: str = "colocations") -> list[ColocationRecord]:
    """Validate the JSON list of colocation records; errors name the offending field."""
    if not isinstance(raw, list):
        raise InvalidInputError(origin, "must be a JSON list of records", 'write [{"gpu": ...}]')
    records: list[ColocationRecord] = []
    for i, item in enumerate(raw):
        where = f"{origin}[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("jobs"), list):
            raise InvalidInputError(where, "must be an object with a jobs list", "add jobs: [...]")
        jobs: list[ColocationJob] = []
        for j, job in enumerate(item["jobs"]):
            jwhere = f"{where}.jobs[{j}]"
            if not isinstance(job, dict) or not isinstance(job.get("profile"), dict):
                raise InvalidInputError(jwhere, "needs a profile object", "add profile: {...}")
            prof = job["profile"]
            values = {
                k: _number(prof.get(k, 0.0), f"{jwhere}.profile.{k}", low=0.0, high=1.0)
                for k in PLACEMENT_COUNTERS
            }
            sm_util = prof.get("sm_utilization")
            if sm_util is not None:
                sm_util = _number(sm_util, f"{jwhere}.profile.sm_utilization", low=0.0, high=1.0)
            rates = {
                k: None if job.get(k) is None else _number(job[k], f"{jwhere}.{k}", low=1e-12)
                for k in ("solo_rate", "colocated_rate")
            }
            jobs.append(
                ColocationJob(
                    name=str(job.get("name", f"job{j}")),
                    profile=counters_pipe_profile(
                        values | {"sm_utilization": sm_util}, gpu_model=str(item.get("gpu", ""))
                    ),
                    thread_percent=int(
                        _number(
                            job.get("thread_percent", SLICES_PER_GPU),
                            f"{jwhere}.thread_percent",
                            low=1,
                            high=SLICES_PER_GPU,
                        )
                    ),
                    solo_rate=rates["solo_rate"],
                    colocated_rate=rates["colocated_rate"],
                )
            )
        records.append(ColocationRecord(gpu=str(item.get("gpu", "")), jobs=tuple(jobs)))
    return records


def observations(records: Sequence[ColocationRecord]) -> list[Observation]:
    """Every job with both rates as a ``gpushare.packing.calibration.Observation`` (its
    slowdown as the record measured it: at the same cap in the GPU benchmark's records)."""
    out: list[Observation] = []
    for record in records:
        for i, job in enumerate(record.jobs):
            slowdown = job.slowdown
            if slowdown is None:
                continue
            others = tuple(
                (o.profile, o.thread_percent) for k, o in enumerate(record.jobs) if k != i
            )
            out.append(Observation(job.profile, job.thread_percent, others, slowdown))
    return out


def _observations(
    records: Sequence[ColocationRecord],
) -> list[tuple[tuple[float, ...], float]]:
    return [
        (features(o.target, o.threads, o.neighbours), math.log(max(o.slowdown, 1e-9)))
        for o in observations(records)
    ]


RIDGE = 1e-3
"""Ridge added to each diagonal entry of X'X: negligible beside a feature the records exercise
(its diagonal sums hundreds of observations), but it keeps a feature that barely varies in the
records from taking a huge coefficient and predicting wild slowdowns where it does vary. Fit
leave-one-kind-out on one H200 run's packs, the FP64 GEMM's packs were predicted with a MAPE of
500 to 240,000 when its neighbours' starvation came from a coefficient fit on near-zero values,
0.11-0.15 with this ridge (docs/benchmarks-gpu.md, "Model generalisation")."""


def _least_squares(
    rows: Sequence[tuple[tuple[float, ...], float]], active: list[int]
) -> list[float]:
    k = len(active)
    xtx = [[0.0] * k for _ in range(k)]
    xty = [0.0] * k
    for x, y in rows:
        sub = [x[i] for i in active]
        for i in range(k):
            xty[i] += sub[i] * y
            for j in range(k):
                xtx[i][j] += sub[i] * sub[j]
    for i in range(k):
        xtx[i][i] += RIDGE
    return solve(xtx, xty)


def fit(
    records: Sequence[ColocationRecord], *, source: str = "", held_out: bool = True
) -> InterferenceModel:
    """Least squares on ln(slowdown), no intercept, coefficients kept non-negative.

    Contention never speeds a job up, so a feature whose coefficient comes out negative is
    dropped and the rest refit (a plain active-set non-negative least squares). Records whose
    solo rates are at the job's own cap (the GPU benchmark's) measure slowdown at the same cap:
    the colocation terms are fit on them alone and ``thread_cap`` on the solo rates at each cap
    (:func:`fit_cap_cost`); records relative to the full GPU fit all six together.
    ``held_out=False`` leaves out the leave-one-record-out MAPE (a refit per record).
    """
    if not _observations(records):
        raise InvalidInputError(
            "records", "contain no job with both solo_rate and colocated_rate", "measure some"
        )
    cap = fit_cap_cost(records)
    coefficients = list(fit_coefficients(records, cap_term=cap is None))
    if cap is not None:
        coefficients[COLOCATION_FEATURES] = cap
    model = InterferenceModel(coefficients=tuple(coefficients), source=source)
    same_cap = cap is not None
    return InterferenceModel(
        coefficients=model.coefficients,
        source=source,
        mape_in_sample=mape(model, records, same_cap=same_cap),
        mape_held_out=held_out_mape(records, same_cap=same_cap)
        if held_out and len(records) > 2
        else None,
        records=len(records),
        jobs=len(_observations(records)),
    )


def relative_errors(
    model: InterferenceModel, records: Sequence[ColocationRecord], *, same_cap: bool = False
) -> list[float]:
    """|predicted - measured| / measured slowdown of every job with both rates (``same_cap``:
    the records' slowdowns are relative to the job alone at its cap). Each record is predicted
    as one pack, as the product predicts a GPU's tenants
    (:meth:`~gpushare.packing.interference.InterferenceModel.predict_pack`)."""
    errors: list[float] = []
    for record in records:
        pack = model.predict_pack([(j.profile, j.thread_percent) for j in record.jobs])
        for job, colocated in zip(record.jobs, pack, strict=True):
            measured = job.slowdown
            if measured is None:
                continue
            cap = 1.0 if same_cap else model.cap_slowdown(job.profile, job.thread_percent)
            errors.append(abs(colocated * cap - measured) / measured)
    return errors


def mape(
    model: InterferenceModel, records: Sequence[ColocationRecord], *, same_cap: bool = False
) -> float:
    """Mean absolute percentage error of predicted vs measured slowdown over all jobs
    (:func:`relative_errors`)."""
    errors = relative_errors(model, records, same_cap=same_cap)
    return sum(errors) / len(errors) if errors else 0.0


def held_out_mape(records: Sequence[ColocationRecord], *, same_cap: bool = False) -> float:
    """Leave-one-record-out MAPE: each record predicted by a model fit on all the others."""
    errors: list[float] = []
    for i, record in enumerate(records):
        rest = [r for k, r in enumerate(records) if k != i]
        if not _observations(rest) or not _observations([record]):
            continue
        model = InterferenceModel(coefficients=fit_coefficients(rest, cap_term=not same_cap))
        jobs = sum(1 for j in record.jobs if j.slowdown is not None)
        errors.extend([mape(model, [record], same_cap=same_cap)] * jobs)
    return sum(errors) / len(errors) if errors else 0.0


def cap_observations(records: Sequence[ColocationRecord]) -> list[tuple[float, float]]:
    """(``thread_cap`` feature, ln(rate at 100% / rate at the cap)) for every job of records
    whose ``solo_rate`` is the rate alone *at the record's cap* (the GPU benchmark's format):
    the same job name on the same GPU with a different solo rate at 100% threads gives the
    cap's own cost. Records whose solo rates are all at 100% give none."""
    full: dict[tuple[str, str], list[float]] = {}
    for record in records:
        for job in record.jobs:
            if job.thread_percent >= SLICES_PER_GPU and job.solo_rate is not None:
                full.setdefault((record.gpu, job.name), []).append(job.solo_rate)
    seen: dict[tuple[str, str, int], tuple[float, float]] = {}
    for record in records:
        for job in record.jobs:
            rates = full.get((record.gpu, job.name))
            if job.thread_percent >= SLICES_PER_GPU or job.solo_rate is None or not rates:
                continue
            ratio = (sum(rates) / len(rates)) / job.solo_rate
            if abs(ratio - 1.0) < 1e-6:  # solo rates relative to the full GPU: no cap data
                continue
            key = (record.gpu, job.name, job.thread_percent)
            seen[key] = (cap_feature(job.profile, job.thread_percent), math.log(max(ratio, 1.0)))
    return list(seen.values())


def fit_cap_cost(records: Sequence[ColocationRecord]) -> float | None:
    """Coefficient of ``thread_cap`` from :func:`cap_observations` (least squares through
    the origin, never negative); None when the records carry no rates at lower caps."""
    rows = [(x, y) for x, y in cap_observations(records) if x > 0]
    if not rows:
        return None
    return max(0.0, sum(x * y for x, y in rows) / sum(x * x for x, _ in rows))


def fit_coefficients(
    records: Sequence[ColocationRecord], *, cap_term: bool = True
) -> tuple[float, ...]:
    """Just the coefficients of :func:`fit` (no accuracy bookkeeping); ``cap_term=False``
    leaves ``thread_cap`` at 0 (records measured at the same cap cannot see it)."""
    rows = _observations(records)
    active = list(range(len(FEATURE_NAMES) if cap_term else COLOCATION_FEATURES))
    coefficients = [0.0] * len(FEATURE_NAMES)
    while active and rows:
        solution = _least_squares(rows, active)
        negative = [active[i] for i, c in enumerate(solution) if c < 0]
        if not negative:
            for i, c in zip(active, solution, strict=True):
                coefficients[i] = c
            break
        active.remove(min(negative, key=lambda i: solution[active.index(i)]))
    return tuple(coefficients)
