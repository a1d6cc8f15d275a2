"""Interference predictions corrected by what GPUs measured (docs/packing.md, "Cautious by
measurement"): the governor (:func:`gpushare.packing.governor.review`) learns a factor per
workload from each shared GPU's measured work rate, and admission and opportunistic placement
predict with the corrected model."""

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpushare.api.names import CLASS_LATENCY
from gpushare.packing.interference import InterferenceModel
from gpushare.packing.model import Demand, PipeProfile, Tenant

K_RANGE = (0.5, 2.0)
"""Bounds of a workload's correction (see :class:`Corrections`)."""


def fit_k(work: Callable[[float], float], target: float, *, steps: int = 24) -> float:
    """The correction factor in :data:`K_RANGE` under which ``work(k)`` (a work rate that
    falls as ``k`` grows) meets ``target``: bisection in log k, ``steps`` halvings; a range end
    when ``target`` lies outside what the range gives. The governor fits its GPUs with it and
    the bench's online evaluation its packs (bench/gpu/online_eval.py)."""
    low, high = math.log(K_RANGE[0]), math.log(K_RANGE[1])
    if work(math.exp(low)) <= target:
        return K_RANGE[0]
    if work(math.exp(high)) >= target:
        return K_RANGE[1]
    for _ in range(steps):
        mid = (low + high) / 2
        if work(math.exp(mid)) > target:
            low = mid
        else:
            high = mid
    return math.exp((low + high) / 2)


K_WEIGHT = 0.2
"""Weight of a new measurement in a workload's correction (the rest is what it was)."""
MIN_WINDOWS = 6
"""Windows a workload's correction must have learned from before predictions use it.

A GPU's measurement says how far the model was off for its tenants together, not for each: a
factor learned from a few windows is mostly its neighbours' error. Replayed over ten runs'
measured packs (bench/results/gpu-online-correction.md), the corrections used at once, with
weight 0.5 within 0.25..4, doubled the error on kinds the model never saw (0.17 -> 0.35) and
tripled it on the others; damped and used from the sixth window on, they lowered both a
little on runs they were not chosen on."""


@dataclass
class Corrections:
    """What GPUs measured of each workload, as a factor ``k`` on the model's predicted
    log-slowdown from its neighbours: a tenant of workload ``w`` predicted ``s`` times slower
    is taken to be ``s ** k(w)`` slower (k < 1: the model was pessimistic about it). Learned
    by the governor (:func:`gpushare.packing.governor.review`) from each GPU's measured work
    rate; 1.0 until learned from :data:`MIN_WINDOWS` windows. Factors given when the object is
    made apply at once (a trial, or a restored state)."""

    factors: dict[str, float] = field(default_factory=dict)
    windows: dict[str, float] = field(default_factory=dict)
    """Windows each workload's factor was learned from, each counted by its weight (``learn``)."""
    min_windows: int = MIN_WINDOWS

    def __post_init__(self) -> None:
        for w in self.factors:
            self.windows.setdefault(w, self.min_windows)

    def k(self, workload: str) -> float:
        if not workload or self.windows.get(workload, 0.0) < self.min_windows - 1e-9:
            return 1.0
        return self.factors.get(workload, 1.0)

    def learn(
        self, workloads: Iterable[str], k: float, *, weights: Mapping[str, float] | None = None
    ) -> None:
        """Move each workload's factor towards ``k`` (bounded to :data:`K_RANGE`).

        ``weights`` (0..1 by workload, 1 where absent) says how much the measurement speaks of
        each: the governor passes each workload's share of the activity it measured, relative
        to the largest share (:func:`gpushare.packing.governor.estimate`). A workload that
        drove almost none of the counters (a notebook between its bursts) moves by that much
        less and counts that much less of a window towards :data:`MIN_WINDOWS`, so its
        neighbours' error is not taken for its own (docs/packing.md, "Cautious by
        measurement")."""
        k = min(max(k, K_RANGE[0]), K_RANGE[1])
        for w in set(workloads):
            if not w:
                continue
            weight = 1.0 if weights is None else min(max(weights.get(w, 1.0), 0.0), 1.0)
            if weight <= 0.0:
                continue
            old = self.factors.get(w, 1.0)
            self.factors[w] = (1 - K_WEIGHT * weight) * old + K_WEIGHT * weight * k
            self.windows[w] = self.windows.get(w, 0.0) + weight


@dataclass(frozen=True)
class _Corrected(InterferenceModel):
    """The model with each target's colocation slowdown raised to its workload's factor."""

    by_profile: tuple[tuple[PipeProfile, float], ...] = ()

    def predict(
        self,
        target: PipeProfile,
        target_threads: int,
        neighbours: Sequence[tuple[PipeProfile, int]],
    ) -> float:
        base = super().predict(target, target_threads, neighbours)
        k = next((k for p, k in self.by_profile if p is target or p == target), 1.0)
        return math.exp(math.log(base) * k) if base > 1.0 else 1.0


def corrected(
    model: InterferenceModel,
    members: Iterable[tuple[PipeProfile | None, str]],
    corrections: Corrections | None,
) -> InterferenceModel:
    """``model`` with the corrections of the ``(profile, workload)`` members (the same model
    when none is corrected)."""
    if corrections is None:
        return model
    pairs = tuple(
        (p, corrections.k(w)) for p, w in members if p is not None and corrections.k(w) != 1.0
    )
    if not pairs:
        return model
    return _Corrected(
        coefficients=model.coefficients,
        feature_names=model.feature_names,
        source=model.source,
        by_profile=pairs,
    )


def cautious(corrections: Corrections | None, workloads: Iterable[str]) -> Corrections | None:
    """``corrections`` with the factors of ``workloads`` never below 1: for the bounds of pods
    that did not opt in, a correction may make the model more careful, never less. A GPU's
    measurement is its tenants' work together, and a small tenant drives little of it: a
    factor below 1 learned there says its neighbours did better than predicted, not that it
    did. On an H200 (run 35, light trace, marked rows) a guaranteed LSTM whose workload had
    learned a factor below 1 (0.52 by the run's end) ran 2.46x its solo time beside a
    transformer the raw model puts it 2.4x slower beside (docs/packing.md, "Cautious by
    measurement"). Guaranteed admission uses no corrections at all."""
    if corrections is None:
        return None
    guarded = {w for w in workloads if w and corrections.factors.get(w, 1.0) < 1.0}
    if not guarded:
        return corrections
    return Corrections(
        factors={w: (1.0 if w in guarded else k) for w, k in corrections.factors.items()},
        windows=dict(corrections.windows),
        min_windows=corrections.min_windows,
    )


def members(parties: Iterable[Tenant | Demand]) -> list[tuple[PipeProfile | None, str]]:
    """The ``(profile, workload)`` of each tenant or newcomer for :func:`corrected`. A latency
    pod is predicted by the model alone: its bound is the tight one, and a correction learned
    from its GPU's total work (mostly its batch neighbours') would loosen it."""
    return [(p.profile, "" if p.gpu_class == CLASS_LATENCY else p.workload) for p in parties]
