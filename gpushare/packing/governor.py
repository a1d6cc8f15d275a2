"""What a shared GPU really gets done, from its measured pipes: cautious by measurement.

Under MPS there are no per-process counters, but the node agent measures the GPU's per-pipe
activity (NVML GPM: FP16, FP32, FP64 and tensor pipes, DRAM bandwidth). A tenant progressing
at rate ``r`` (of its speed alone) drives each pipe at about ``r`` times what it drove alone
(its solo profile ``d``), so the GPU's activity is ``a ~ sum r_i d_i``. With the rates the
model predicts, ``E = sum r^_i d_i``, the least-squares scale ``s = (a . E) / (E . E)`` says
how far reality is from the prediction, and ``s x sum r^_i`` is the work the GPU does per
second (:func:`estimate`).

:func:`review` holds the newest running opportunistic tenant of a GPU to what it was placed
for: no tenant that did not opt in may be measured past its class bound, and where such a tenant
is on the GPU, the GPU measured with it must do at least the predicted work without it plus
:data:`~gpushare.packing.opportunistic.KEEP_FRACTION` of the predicted gain; otherwise it is
paused (it keeps its memory and loses no work; docs/packing.md, "The sharing contract"). No
preemption among equals: among pods that all opted in, nobody is paused for anybody. Paused
tenants drive no counters and count in no prediction. Every estimate also teaches the
corrections (:class:`~gpushare.packing.opportunistic.Corrections`) what the model got wrong
about the workloads on the GPU, each in proportion to how much of the counters it drove
(``Estimate.shares``), which the next opportunistic decisions use (docs/packing.md, "Cautious
by measurement")."""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gpushare.api.names import CLASS_LATENCY
from gpushare.api.profile import ACTIVITY
from gpushare.packing.corrections import Corrections, cautious, corrected, fit_k
from gpushare.packing.model import GpuState, PipeProfile, Tenant
from gpushare.packing.opportunistic import KEEP_FRACTION, Member, Opportunism, member, rates

MIN_SIGNAL = 0.05
"""Predicted activity (vector length) below which a GPU's counters say too little to judge."""
SETTLE_S = 30.0
"""How long an opportunistic tenant runs before the governor judges it (its start-up, and a
window of counters that is all with it)."""


def activity(profile: PipeProfile) -> tuple[float, ...]:
    return tuple(max(0.0, float(getattr(profile, k))) for k in ACTIVITY)


@dataclass(frozen=True)
class Estimate:
    """One GPU's measured work against the prediction."""

    scale: float
    """Measured activity over predicted (1: as predicted; below: less work done)."""
    work_rate: float
    """Batch work per second measured (jobs' worth): ``scale`` x the predicted rates."""
    predicted: float
    """Batch work per second the (corrected) model predicted for these tenants."""
    rates: tuple[float, ...]
    """Each tenant's estimated rate (the prediction x ``scale``, at most 1)."""
    k: float
    """The correction factor that explains the measurement (see ``Corrections``)."""
    shares: tuple[float, ...] = ()
    """How much of the measurement speaks of each tenant: its part of the predicted activity
    along the prediction (``r_i d_i . E / E . E``, summing to 1), over the largest part. The
    corrections learn each workload's factor by it (``Corrections.learn``): a tenant that
    drives next to none of the counters (a notebook that sleeps between bursts) is barely
    measured, whatever the scale says of its neighbours."""


def _member_activity(members: Sequence[Member], predicted: Sequence[float]) -> list[list[float]]:
    """Each member's ``r_i d_i``; a latency service serves its requests whatever its slowdown
    (its latency grows, not its work), so it drives what it drove alone."""
    return [
        [(1.0 if m.gpu_class == CLASS_LATENCY else r) * v for v in activity(m.profile)]
        for m, r in zip(members, predicted, strict=True)
    ]


def _shares(parts: Sequence[Sequence[float]], expected: Sequence[float]) -> tuple[float, ...]:
    """Each part's projection on ``expected`` over the largest one's (see ``Estimate.shares``)."""
    raw = [max(0.0, sum(a * e for a, e in zip(p, expected, strict=True))) for p in parts]
    top = max(raw, default=0.0)
    return tuple(r / top if top > 0.0 else 1.0 for r in raw)


def estimate(
    tenants: Sequence[Tenant], measured: PipeProfile, opportunism: Opportunism
) -> Estimate | None:
    """The GPU's measured work rate with ``tenants`` on it (module doc); None when the
    prediction drives the counters too little to tell (small launch-bound jobs only)."""
    return _estimate(tenants, measured, opportunism, opportunism.corrections)


def _estimate(
    tenants: Sequence[Tenant],
    measured: PipeProfile,
    opportunism: Opportunism,
    corrections: Corrections | None,
    *,
    fit: bool = True,
) -> Estimate | None:
    """:func:`estimate` through ``corrections``; ``fit=False`` leaves ``k`` at 1 (a reading of
    the rates only: the bisection is the estimate's costliest part)."""
    members = [member(t) for t in tenants]
    model = corrected(opportunism.model, [(t.profile, t.workload) for t in tenants], corrections)
    predicted = rates(members, model)
    parts = _member_activity(members, predicted)
    expected = [sum(column) for column in zip(*parts, strict=True)]
    norm = math.sqrt(sum(v * v for v in expected))
    if norm < MIN_SIGNAL:
        return None
    seen = activity(measured)
    scale = sum(a * e for a, e in zip(seen, expected, strict=True)) / (norm * norm)
    batch = [m.gpu_class != CLASS_LATENCY for m in members]
    predicted_work = sum(r for r, b in zip(predicted, batch, strict=True) if b)
    measured_work = scale * predicted_work
    return Estimate(
        scale=scale,
        work_rate=measured_work,
        predicted=predicted_work,
        rates=tuple(min(1.0, r * scale) for r in predicted),
        k=_fit_k(members, batch, opportunism, measured_work) if fit else 1.0,
        shares=_shares(parts, expected),
    )


def _fit_k(
    members: Sequence[Member], batch: Sequence[bool], opportunism: Opportunism, target: float
) -> float:
    """The one correction factor (applied to every member) under which the raw model predicts
    ``target`` work per second: bisection in log k, the work rate falls as k grows."""

    def work(k: float) -> float:
        trial = Corrections({m.workload or f"#{i}": k for i, m in enumerate(members)})
        named = [replace(m, workload=m.workload or f"#{i}") for i, m in enumerate(members)]
        model = corrected(opportunism.model, [(m.profile, m.workload) for m in named], trial)
        return sum(r for r, b in zip(rates(named, model), batch, strict=True) if b)

    return fit_k(work, target)


@dataclass(frozen=True)
class Verdict:
    """What the governor decided for one GPU."""

    pause: str | None
    """The opportunistic tenant (pod key) to pause, or None to keep everyone running."""
    reason: str
    estimate: Estimate | None
    beside: tuple[str, ...] = ()
    """The tenants (pod keys) it was judged beside: the one measured past its bound, else
    those that did not opt in. The paused tenant runs again once they have left the GPU
    (``Opportunism.resumptions``)."""


def review(
    gpu: GpuState,
    measured: PipeProfile,
    opportunism: Opportunism,
    *,
    now: float,
    settle_s: float = SETTLE_S,
    learn: bool = True,
    resumed: Mapping[str, float] | None = None,
) -> Verdict:
    """Judge ``gpu``'s newest running opportunistic tenant by the GPU's measured activity over
    a window that is all after it settled (module doc): ``settle_s`` after it was placed, or
    after it was last resumed (``resumed``: seconds since the epoch by pod key; a window with
    it paused would read as harm). Every GPU shared by profiled running tenants also teaches
    the corrections (``learn``), opportunistic tenants or not: that is how the next
    opportunistic decision knows what the model gets wrong about the workloads."""
    gpu = gpu.running()  # a paused tenant drives no counter
    opportunistic = [t for t in gpu.tenants if t.opportunistic]
    newest = max(opportunistic, key=lambda t: t.placed_at) if opportunistic else None
    started = 0.0
    if newest is not None:
        started = max(newest.placed_at, (resumed or {}).get(newest.key, 0.0))
    settled = newest is None or now - started >= settle_s
    shared = sum(1 for t in gpu.tenants if t.profile is not None) >= 2
    if not settled or not (shared or newest is not None):
        return Verdict(None, "nothing to judge yet", None)
    found = estimate(gpu.tenants, measured, opportunism)
    if found is None:
        return Verdict(None, "too little activity to judge", None)
    verdict = (
        _judge(gpu, newest, found, measured, opportunism)
        if newest is not None
        else Verdict(None, f"measured {found.work_rate:.2f} jobs/s", found)
    )
    if learn and shared:
        weights: dict[str, float] = {}
        for tenant, share in zip(gpu.tenants, found.shares, strict=True):
            weights[tenant.workload] = max(weights.get(tenant.workload, 0.0), share)
        opportunism.corrections.learn(weights, found.k, weights=weights)
    return verdict


def _judge(
    gpu: GpuState,
    newest: Tenant,
    found: Estimate,
    measured: PipeProfile,
    opportunism: Opportunism,
) -> Verdict:
    """Pause ``newest`` if a tenant that did not opt in is measured past its bound, or the GPU
    does less than the prediction without it plus part of its gain (module doc). The bounds
    are read through :func:`~gpushare.packing.corrections.cautious` corrections, as where the
    newcomer was placed: a factor below 1 that a protected tenant learned from its neighbours'
    work never makes its measured slowdown look smaller."""
    protected = [t.key for t in gpu.tenants if not t.equal]
    if not protected:
        return Verdict(
            None, "every tenant opted in: no preemption among equals, everyone kept", found
        )
    guarded = cautious(opportunism.corrections, [t.workload for t in gpu.tenants if not t.equal])
    held = (
        found
        if guarded is opportunism.corrections
        else _estimate(gpu.tenants, measured, opportunism, guarded, fit=False)
    )
    for tenant, rate in zip(gpu.tenants, (held or found).rates, strict=True):
        if tenant.equal:
            continue
        bound = opportunism.bounds.get(tenant.gpu_class)
        if bound is not None and rate > 0 and 1.0 / rate > bound:
            return Verdict(
                newest.key,
                f"{tenant.gpu_class} pod {tenant.key} measured at {1.0 / rate:.2f}x its speed "
                f"alone, over its {bound:.2f}x bound",
                found,
                beside=(tenant.key,),
            )
    without = [member(t) for t in gpu.tenants if t is not newest]
    model = corrected(
        opportunism.model, [(t.profile, t.workload) for t in gpu.tenants], opportunism.corrections
    )
    before = sum(
        r
        for r, m in zip(rates(without, model), without, strict=True)
        if m.gpu_class != CLASS_LATENCY
    )
    predicted_gain = found.predicted - before
    wanted = before + KEEP_FRACTION * max(predicted_gain, 0.0)
    if found.work_rate < wanted:
        return Verdict(
            newest.key,
            f"the GPU measured {found.work_rate:.2f} jobs/s with it, below {wanted:.2f} "
            f"(predicted {before:.2f} without it plus half the predicted gain "
            f"{predicted_gain:.2f})",
            found,
            beside=tuple(protected),
        )
    return Verdict(
        None, f"measured {found.work_rate:.2f} jobs/s, at least {wanted:.2f}: kept", found
    )
