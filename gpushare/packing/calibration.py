"""Refining the interference model with colocations measured on the GPUs it will decide for.

The shipped coefficients (:func:`gpushare.packing.interference.load_default`) come from other
hosts, and on a new host the same packs can slow down several times more or less (docs/packing.md,
"Calibrating on your GPUs"). A few packs measured on the cluster's own GPUs move it back.

:func:`calibrate` is a refit anchored to the model it starts from: it minimises the squared
error of ``ln(slowdown)`` on the new observations plus ``prior_weight`` observations' worth of
pull toward each prior coefficient (a ridge toward the prior, not toward zero), keeping every
coefficient non-negative. With no observations it returns the prior; a feature the observations
never exercise keeps its prior value; with many observations the local fit wins. The thread-cap
coefficient is kept: colocations measured at the same cap cannot see it.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpushare.api.errors import InvalidInputError
from gpushare.packing.interference import COLOCATION_FEATURES, InterferenceModel, features
from gpushare.packing.model import PipeProfile

PRIOR_WEIGHT = 1.0
"""The pull toward each prior coefficient, as that many observations whose feature is 1 (the
features are shares and logs of shares, mostly 0-1), chosen by leaving out each known job kind
in turn (docs/packing.md, "Where the constants come from"). A weight of the feature's scale
rather than the data's: a feature the observations barely exercise (starvation, without a
pipe-saturating kind) must not run off."""
_FLOOR = 1e-9


@dataclass(frozen=True)
class Observation:
    """One job measured beside neighbours: ``slowdown`` is its rate alone at its own thread
    cap over its rate beside them (>= 0; the model's ``predict`` answers the same question)."""

    target: PipeProfile
    threads: int
    neighbours: tuple[tuple[PipeProfile, int], ...]
    slowdown: float


def solve(matrix: Sequence[Sequence[float]], rhs: Sequence[float]) -> list[float]:
    """``matrix @ x = rhs`` by Gaussian elimination with partial pivoting (numpy is not a
    dependency); a singular column gives 0."""
    n = len(rhs)
    a = [[*row, rhs[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        p = a[col][col]
        if abs(p) < 1e-15:
            continue
        for r in range(n):
            if r != col and a[r][col] != 0.0:
                f = a[r][col] / p
                for c in range(col, n + 1):
                    a[r][c] -= f * a[col][c]
    return [a[i][n] / a[i][i] if abs(a[i][i]) >= 1e-15 else 0.0 for i in range(n)]


def anchored_nnls(
    rows: Sequence[tuple[Sequence[float], float]],
    prior: Sequence[float],
    penalty: Sequence[float],
) -> list[float]:
    """Non-negative ``c`` minimising ``sum (y - c.x)^2 + sum penalty_i (c_i - prior_i)^2``.

    An active set: solve, fix the most negative coefficient at zero, solve again. With a zero
    prior and a small penalty this is the ridge least squares the shipped model is fit with."""
    k = len(prior)
    active = list(range(k))
    out = [0.0] * k
    while active:
        xtx = [[0.0] * len(active) for _ in active]
        xty = [0.0] * len(active)
        for x, y in rows:
            sub = [x[i] for i in active]
            for i, xi in enumerate(sub):
                if xi == 0.0:
                    continue
                xty[i] += xi * y
                for j, xj in enumerate(sub):
                    xtx[i][j] += xi * xj
        for i, f in enumerate(active):
            xtx[i][i] += penalty[f]
            xty[i] += penalty[f] * prior[f]
        solution = solve(xtx, xty)
        negative = [i for i, c in enumerate(solution) if c < 0]
        if not negative:
            for f, c in zip(active, solution, strict=True):
                out[f] = c
            return out
        active.pop(min(negative, key=lambda i: solution[i]))
    return out


def calibrate(
    prior: InterferenceModel,
    observations: Sequence[Observation],
    *,
    prior_weight: float = PRIOR_WEIGHT,
    source: str = "",
) -> InterferenceModel:
    """``prior`` refit on ``observations`` (see the module doc).

    Each colocation coefficient is pulled toward its prior value with the weight of
    ``prior_weight`` observations whose feature is 1 (:data:`PRIOR_WEIGHT`). The result's
    ``source`` names the prior, the observations and the weight; ``mape_in_sample`` is its
    error on the observations."""
    if not math.isfinite(prior_weight) or prior_weight < 0:
        raise InvalidInputError(
            "prior_weight", f"{prior_weight!r} is not a non-negative number", "use e.g. 8"
        )
    rows: list[tuple[tuple[float, ...], float]] = []
    for i, obs in enumerate(observations):
        if not math.isfinite(obs.slowdown) or obs.slowdown <= 0:
            raise InvalidInputError(
                f"observations[{i}].slowdown", f"{obs.slowdown!r} is not positive", "measure it"
            )
        if not obs.neighbours:
            continue
        x = features(obs.target, obs.threads, obs.neighbours)[:COLOCATION_FEATURES]
        rows.append((x, math.log(obs.slowdown)))
    if not rows:
        return prior
    start = prior.coefficients[:COLOCATION_FEATURES]
    penalty = [max(prior_weight, _FLOOR)] * COLOCATION_FEATURES
    fitted = anchored_nnls(rows, start, penalty)
    model = InterferenceModel(
        coefficients=(*fitted, *prior.coefficients[COLOCATION_FEATURES:]),
        feature_names=prior.feature_names,
        source=source
        or f"calibrated: {prior.source or 'prior'} + {len(rows)} observations "
        f"(prior weight {prior_weight:g})",
        records=prior.records,
        jobs=prior.jobs + len(rows),
    )
    errors = [abs(model.from_features(x) - math.exp(y)) / math.exp(y) for x, y in rows]
    return replace(model, mape_in_sample=sum(errors) / len(errors))
