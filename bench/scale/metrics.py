"""Prometheus histograms scraped before and after a phase: deltas and quantiles.

Quantiles are estimated the way PromQL's ``histogram_quantile`` does (linear within a bucket),
so they are only as fine as the histogram's buckets; each result says which bucket bounds it.
"""

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

LabelFilter = Callable[[Mapping[str, str]], bool]


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts by upper bound (``+Inf`` included), plus sum and count."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    def minus(self, earlier: "Histogram") -> "Histogram":
        before = dict(earlier.buckets)
        return Histogram(
            tuple((le, c - before.get(le, 0.0)) for le, c in self.buckets),
            self.sum - earlier.sum,
            self.count - earlier.count,
        )

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0..1) by linear interpolation in its bucket; None when empty. A
        quantile in the +Inf bucket returns the largest finite bound."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(le):
                    return lower
                width = cumulative - below
                if width <= 0:
                    return le
                return lower + (le - lower) * (rank - below) / width
            lower, below = le, cumulative
        return lower

    def overflows(self, q: float) -> bool:
        """True when the q-quantile lies beyond the last finite bucket (then ``quantile``
        returns that bucket's bound: a lower limit, not an estimate)."""
        finite = [c for le, c in self.buckets if not math.isinf(le)]
        return self.count > 0 and bool(finite) and finite[-1] < q * self.count

    def bucket_bounds(self, value: float) -> tuple[float, float]:
        """The (lower, upper) bucket bounds around ``value``: the estimate's resolution."""
        lower = 0.0
        for le, _ in self.buckets:
            if value <= le:
                return lower, le
            lower = le
        return lower, math.inf

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None


EMPTY = Histogram((), 0.0, 0.0)


def histogram(text: str, name: str, where: LabelFilter | None = None) -> Histogram:
    """Sum of the series of histogram ``name`` in a /metrics page whose labels pass ``where``
    (every series when None). Missing metric: an empty histogram."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k != "le"}
            if where is not None and not where(labels):
                continue
            if sample.name == f"{name}_bucket":
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
            elif sample.name == f"{name}_sum":
                total += sample.value
            elif sample.name == f"{name}_count":
                count += sample.value
    return Histogram(tuple(sorted(buckets.items())), total, count)


def counter(text: str, name: str, where: LabelFilter | None = None) -> float:
    """Sum of counter or gauge ``name`` over the series whose labels pass ``where``."""
    value = 0.0
    for family in text_string_to_metric_families(text):
        series = (family.name, f"{family.name}_total")
        if name not in series:
            continue
        for sample in family.samples:
            if sample.name in series and (where is None or where(sample.labels)):
                value += sample.value
    return value


def label_values(text: str, name: str, label: str) -> list[str]:
    """Distinct values of ``label`` on metric family ``name`` (e.g. the verbs an extender
    histogram has)."""
    seen: dict[str, None] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if label in sample.labels:
                seen.setdefault(sample.labels[label], None)
    return list(seen)


def summarize(h: Histogram, *, scale: float = 1000.0) -> dict[str, Any]:
    """p50/p90/p99 and mean of a histogram in milliseconds (``scale`` from seconds), with the
    bucket bounds around p99 so a reader sees the resolution."""

    def ms(v: float | None) -> float | None:
        return None if v is None or math.isinf(v) else round(v * scale, 3)

    p99 = h.quantile(0.99)
    bounds = h.bucket_bounds(p99) if p99 is not None else None
    if bounds is not None and h.overflows(0.99):
        bounds = (bounds[1], math.inf)
    return {
        "count": int(h.count),
        "mean_ms": ms(h.mean),
        "p50_ms": ms(h.quantile(0.5)),
        "p90_ms": ms(h.quantile(0.9)),
        "p99_ms": ms(p99),
        "p99_bucket_ms": None if bounds is None else [ms(bounds[0]), ms(bounds[1])],
        "p99_beyond_last_bucket": h.overflows(0.99),
    }
