"""Small, dependency-free statistics used by the workers and the report."""

import math
import random
from collections.abc import Iterator, Sequence


def poisson_arrivals(
    *, rate_hz: float, start: float, end: float | None, count: int | None, seed: int
) -> Iterator[float]:
    """Arrival times of a Poisson process from ``start``: until ``end`` or ``count`` arrivals."""
    if rate_hz <= 0:
        raise ValueError(f"rate_hz must be > 0, got {rate_hz}")
    if end is None and count is None:
        raise ValueError("give end or count, or the arrivals never stop")
    rng = random.Random(seed)
    t = start
    n = 0
    while count is None or n < count:
        t += rng.expovariate(rate_hz)
        if end is not None and t > end:
            return
        n += 1
        yield t


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100] (numpy's default method)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def mape(pairs: Sequence[tuple[float, float]]) -> float:
    """Mean absolute percentage error of (predicted, actual) pairs, as a fraction."""
    usable = [(p, a) for p, a in pairs if a > 0]
    if not usable:
        raise ValueError("MAPE needs at least one positive actual value")
    return sum(abs(p - a) / a for p, a in usable) / len(usable)


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of no values")
    return sum(values) / len(values)
