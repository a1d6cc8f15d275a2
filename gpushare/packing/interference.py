"""How much slower a job runs beside its GPU neighbours: a small, inspectable linear model.

After KACE (kernel-aware colocation): aggregate the solo profiles of the target and of its
neighbours into a few features and fit a linear regression on measured colocations, with
``ln(slowdown)`` as the target so effects compose multiplicatively. The features rest on the
share of SMs each job keeps busy (its SM utilization alone, no more than its MPS thread cap;
a job without a measured SM utilization is assumed to fill its cap), because that, not SM
occupancy, is what launch-bound jobs contend for (H200: ResNet-18 at batch 32 has occupancy
0.12 but keeps 38% of the SMs busy, and three of them at 50% threads each ran 1.29x slower):

- ``time_share``: ``ln(max(1, busy of all))`` -- once the jobs want more SMs than there are,
  they take turns (two transformers at 87% each: 1.87x);
- ``dominance``: the same, times how much larger the busiest neighbour's share is than the
  target's (up to 3x): a job with small kernels waits behind one with large kernels (an LSTM
  beside a transformer ran 3.8x slower, the transformer 1.1x);
- ``starvation``: how nearly the neighbours saturate a compute pipe (``min(1, their pipes)^4``)
  x how little of its own the target has, where thread caps overlap -- an FP64 GEMM running its
  DMMA pipe at 97% starved every uncapped neighbour to 2% of its speed, at 50/50 caps 1.2x;
- ``neighbour_busy``: the neighbours' SM share itself (four ResNet-18 at 25% threads, which
  fit the GPU exactly, still ran 1.28x slower);
- ``dram_contention``: product of DRAM bandwidth shares plus any oversubscription of it;
- ``thread_cap``: the target's own cost of its MPS thread cap, ``demand x ln(100 / threads)``.

A target that saturates a pipe itself is barely slowed by anyone (the GEMM kept 99% of its
speed beside every other job), so the first, second and fourth terms are scaled by
``1 - min(1, its pipes)^4`` -- except by neighbours on the same pipe: the scale is at least
the product of its and their busy shares of each pipe, summed (two FP64 GEMMs on the DMMA
pipe: 2.0x each, where the shield alone predicted 1.2x). Checked held-out on two H200 runs'
packs: 5-fold MAPE 0.098 -> 0.094 and 0.104 -> 0.0996.

MPS thread caps partition the SMs: only where the caps of the
target and its neighbours add up to more than 100% can a pipe-saturating neighbour reach its
SMs, so ``starvation`` is scaled by ``max(0, its cap + the neighbours' caps - 100) / its cap``.
For the same reason a capped target waits less for its neighbours' turns: ``cap_relief`` is
``-(1 - its cap) x time_share`` (0 for an uncapped job), with a non-negative coefficient like
the rest, so it only takes away. Measured on an H200, small jobs stacked four deep at 50% threads
ran 1.14-1.46x slower where time_share alone predicted 1.74-2.01x; with the term the held-out
MAPE of two runs' packs fell 0.0996 -> 0.0899 and 0.107 -> 0.094 (5-fold), and fit on one run,
tested on the other, 0.097 -> 0.087 and 0.089 -> 0.082.

Measurements give rates relative to the job alone at the same thread cap; the ``thread_cap``
term is kept for records relative to the full GPU. :meth:`InterferenceModel.predict` leaves it
out and answers the colocation question: the slowdown relative to the same job alone at the
same cap, never below 1.0.
"""

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import CLASS_LATENCY, SLICES_PER_GPU
from gpushare.packing.model import Demand, GpuState, PipeProfile, Tenant
from gpushare.packing.threads import MIN_BATCH_THREADS, assign_thread_percent, compute_demand

FEATURE_NAMES: tuple[str, ...] = (
    "time_share",
    "dominance",
    "starvation",
    "neighbour_busy",
    "dram_contention",
    "cap_relief",
    "thread_cap",
)
_COLOCATION = 6
"""The first six features describe the neighbours; the last one the target's own cap."""
PREVIOUS_FEATURE_NAMES: tuple[str, ...] = tuple(n for n in FEATURE_NAMES if n != "cap_relief")
"""The features before ``cap_relief``: a model file written with them still loads, with no
relief (the model it was fit as)."""

CONSERVATIVE_PROFILE = PipeProfile(
    fp16=0.3, fp32=0.6, fp64=0.0, tensor=0.6, sm_occupancy=0.9, dram_bandwidth=0.6
)
"""Stand-in for a tenant nobody has profiled yet: assume it is heavy, so the model errs towards
refusing a latency pod rather than promising what it cannot keep."""

_PROFILE_KEYS = ("fp16", "fp32", "fp64", "tensor", "sm_occupancy", "dram_bandwidth")
_MIN_OCCUPANCY = 0.05
_MIN_BUSY = 0.01
DOMINANCE_CAP = 3.0
"""Largest ratio of the busiest neighbour's SM share to the target's that ``dominance`` counts."""
SATURATION_POWER = 4
"""``min(1, pipes)^4``: near 1 only for a job that keeps a pipe almost fully busy."""


Load = tuple[float, float, float, float, float, float, float, float, float]
"""(occupancy, fp16, fp32, fp64, tensor, dram, cap, busy, largest busy) of one job or a sum of
jobs; cap = threads / 100, busy = share of SMs kept busy (summed; the last field is the largest
single job's)."""
_ZERO: Load = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def busy_share(profile: PipeProfile, threads: int) -> float:
    """Share of the SMs the job keeps busy at ``threads``: its SM utilization alone, no more
    than its cap; without a measured SM utilization, the whole cap."""
    cap = max(1, min(threads, SLICES_PER_GPU)) / SLICES_PER_GPU
    if profile.sm_utilization is None:
        return cap
    return min(cap, max(profile.sm_utilization, 0.0))


def load_of(profile: PipeProfile, threads: int) -> Load:
    """The job's loads scaled down by its thread cap where the cap is below its compute demand
    (a job capped at 40% of the threads cannot keep more than 40% of the GPU busy)."""
    cap = max(1, min(threads, SLICES_PER_GPU)) / SLICES_PER_GPU
    scale = min(1.0, cap / max(compute_demand(profile), _MIN_OCCUPANCY))
    busy = busy_share(profile, threads)
    return (
        profile.sm_occupancy * scale,
        profile.fp16 * scale,
        profile.fp32 * scale,
        profile.fp64 * scale,
        profile.tensor * scale,
        profile.dram_bandwidth * scale,
        cap,
        busy,
        busy,
    )


def add_loads(a: Load, b: Load) -> Load:
    return (
        a[0] + b[0],
        a[1] + b[1],
        a[2] + b[2],
        a[3] + b[3],
        a[4] + b[4],
        a[5] + b[5],
        a[6] + b[6],
        a[7] + b[7],
        max(a[8], b[8]),
    )


def sum_loads(loads: Sequence[Load]) -> Load:
    total = _ZERO
    for load in loads:
        total = add_loads(total, load)
    return total


def cap_feature(profile: PipeProfile, threads: int) -> float:
    """``thread_cap``: how busy the job keeps the GPU alone x ln(100 / threads) (0 at 100%).

    Busy is its SM utilization where measured (what a cap takes away: on an H200 ResNet-18,
    38% of SMs busy, kept 0.84 of its speed at 50% threads and 0.60 at 25%; ResNet-50 and a
    transformer, 84-87% busy, 0.64-0.65 and 0.35), else its compute demand."""
    cap = max(1, min(threads, SLICES_PER_GPU))
    busy = profile.sm_utilization if profile.sm_utilization is not None else None
    demand = compute_demand(profile) if busy is None else max(busy, 0.0)
    return demand * math.log(SLICES_PER_GPU / cap)


def features_from(target: Load, neighbours: Load, cap_cost: float = 0.0) -> tuple[float, ...]:
    """The model's inputs from the target's load and the neighbours' summed loads."""
    _, h_t, s_t, d_t, x_t, m_t, c_t, b_t, _ = target
    _, h_n, s_n, d_n, x_n, m_n, c_n, b_n, b_max = neighbours
    pipes_t = h_t + s_t + d_t + x_t
    pipes_n = h_n + s_n + d_n + x_n
    same_pipe = sum(
        min(1.0, mine) * min(1.0, theirs)
        for mine, theirs in ((h_t, h_n), (s_t, s_n), (d_t, d_n), (x_t, x_n))
    )
    exposed = max(1.0 - min(1.0, pipes_t) ** SATURATION_POWER, min(1.0, same_pipe))
    turns = math.log(max(1.0, b_t + b_n))
    bigger = max(0.0, min(DOMINANCE_CAP, b_max / max(b_t, _MIN_BUSY)) - 1.0)
    shared = min(1.0, max(0.0, c_t + c_n - 1.0) / c_t) if c_t > 0 else 0.0
    starve = shared * min(1.0, pipes_n) ** SATURATION_POWER * max(0.0, 1.0 - pipes_t)
    dram = m_t * m_n + max(0.0, m_t + m_n - 1.0)
    time_share = exposed * turns
    return (
        time_share,
        time_share * bigger,
        starve,
        exposed * b_n,
        dram,
        -(1.0 - min(1.0, c_t)) * time_share,
        cap_cost,
    )


def features(
    target: PipeProfile, target_threads: int, neighbours: Sequence[tuple[PipeProfile, int]]
) -> tuple[float, ...]:
    """The model's inputs for one target job (see the module docstring), in FEATURE_NAMES order."""
    total = sum_loads([load_of(profile, threads) for profile, threads in neighbours])
    return features_from(
        load_of(target, target_threads), total, cap_feature(target, target_threads)
    )


@dataclass(frozen=True)
class InterferenceModel:
    """ln(slowdown) = coefficients . features; slowdown never below 1."""

    coefficients: tuple[float, ...]
    feature_names: tuple[str, ...] = FEATURE_NAMES
    source: str = ""
    """Where the coefficients came from (data set, or the seed numbers they were derived from)."""
    mape_in_sample: float | None = None
    """Mean absolute percentage error of the slowdown on the records it was fit on."""
    mape_held_out: float | None = None
    """Same, each record predicted by a model fit without it (leave-one-record-out)."""
    records: int = 0
    jobs: int = 0

    def __post_init__(self) -> None:
        if len(self.coefficients) != len(self.feature_names):
            raise InvalidInputError(
                "coefficients",
                f"has {len(self.coefficients)} values for {len(self.feature_names)} features",
                "give one coefficient per feature name",
            )

    def predict(
        self,
        target: PipeProfile,
        target_threads: int,
        neighbours: Sequence[tuple[PipeProfile, int]],
    ) -> float:
        """Slowdown factor (>= 1.0) of ``target`` beside ``neighbours`` (profile, threads),
        relative to the same job alone at the same thread cap."""
        if not neighbours:
            return 1.0
        x = features(target, target_threads, neighbours)
        return self._colocation(x)

    def predict_load(self, target: Load, neighbours: Load) -> float:
        """:meth:`predict` from precomputed loads (``neighbours`` summed)."""
        if neighbours[6] <= 0.0 and neighbours[7] <= 0.0:
            return 1.0
        return self._colocation(features_from(target, neighbours))

    def _colocation(self, x: Sequence[float]) -> float:
        c = self.coefficients
        z = c[0] * x[0] + c[1] * x[1] + c[2] * x[2] + c[3] * x[3] + c[4] * x[4] + c[5] * x[5]
        return math.exp(z) if z > 0 else 1.0

    def cap_slowdown(self, target: PipeProfile, threads: int) -> float:
        """Slowdown of ``target`` alone at ``threads`` relative to alone at 100% threads."""
        return math.exp(self.coefficients[_COLOCATION] * cap_feature(target, threads))

    def predict_vs_full_gpu(
        self,
        target: PipeProfile,
        target_threads: int,
        neighbours: Sequence[tuple[PipeProfile, int]],
    ) -> float:
        """Slowdown relative to the job alone at 100% threads (what colocation records
        measure): :meth:`predict` x :meth:`cap_slowdown`."""
        return self.predict(target, target_threads, neighbours) * self.cap_slowdown(
            target, target_threads
        )

    def explain(
        self,
        target: PipeProfile,
        target_threads: int,
        neighbours: Sequence[tuple[PipeProfile, int]],
    ) -> dict[str, float]:
        """Each feature's contribution to ln(slowdown vs the full GPU), for logs and for users
        asking why."""
        x = features(target, target_threads, neighbours)
        return {n: c * v for n, c, v in zip(self.feature_names, self.coefficients, x, strict=True)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "feature_names": list(self.feature_names),
            "coefficients": [round(c, 6) for c in self.coefficients],
            "mape_in_sample": self.mape_in_sample,
            "mape_held_out": self.mape_held_out,
            "records": self.records,
            "jobs": self.jobs,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, origin: str = "model") -> "InterferenceModel":
        fix = "refit it with bench/sim/fit_interference.py"
        try:
            names = tuple(str(n) for n in raw.get("feature_names", FEATURE_NAMES))
            coefficients = tuple(float(c) for c in raw["coefficients"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInputError(origin, f"bad interference model ({exc})", fix) from None
        if names == PREVIOUS_FEATURE_NAMES and len(coefficients) == len(names):
            at = FEATURE_NAMES.index("cap_relief")
            coefficients = (*coefficients[:at], 0.0, *coefficients[at:])
            names = FEATURE_NAMES
        if names != FEATURE_NAMES:
            raise InvalidInputError(
                f"{origin}.feature_names", f"{list(names)} are not this version's features", fix
            )
        return cls(
            coefficients=coefficients,
            feature_names=names,
            source=str(raw.get("source", "")),
            mape_in_sample=_opt_float(raw.get("mape_in_sample")),
            mape_held_out=_opt_float(raw.get("mape_held_out")),
            records=int(raw.get("records", 0)),
            jobs=int(raw.get("jobs", 0)),
        )


def _opt_float(value: object) -> float | None:
    return None if value is None else float(str(value))


@lru_cache(maxsize=1)
def load_default() -> InterferenceModel:
    """The model shipped in ``gpushare/packing/data/interference.json``."""
    text = resources.files("gpushare.packing").joinpath("data/interference.json").read_text()
    return InterferenceModel.from_dict(json.loads(text), origin="interference.json")


# --- measured colocations and fitting ------------------------------------------------------


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
                for k in _PROFILE_KEYS
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
                    profile=PipeProfile(
                        fp16=values["fp16"],
                        fp32=values["fp32"],
                        fp64=values["fp64"],
                        tensor=values["tensor"],
                        sm_occupancy=values["sm_occupancy"],
                        dram_bandwidth=values["dram_bandwidth"],
                        gpu_model=str(item.get("gpu", "")),
                        sm_utilization=sm_util,
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


def _observations(
    records: Sequence[ColocationRecord],
) -> list[tuple[tuple[float, ...], float]]:
    rows: list[tuple[tuple[float, ...], float]] = []
    for record in records:
        for i, job in enumerate(record.jobs):
            slowdown = job.slowdown
            if slowdown is None:
                continue
            others = [(o.profile, o.thread_percent) for k, o in enumerate(record.jobs) if k != i]
            x = features(job.profile, job.thread_percent, others)
            rows.append((x, math.log(max(slowdown, 1e-9))))
    return rows


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (numpy is not a dependency)."""
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
    return _solve(xtx, xty)


def fit(records: Sequence[ColocationRecord], *, source: str = "") -> InterferenceModel:
    """Least squares on ln(slowdown), no intercept, coefficients kept non-negative.

    Contention never speeds a job up, so a feature whose coefficient comes out negative is
    dropped and the rest refit (a plain active-set non-negative least squares). Records whose
    solo rates are at the job's own cap (the GPU benchmark's) measure slowdown at the same cap:
    the colocation terms are fit on them alone and ``thread_cap`` on the solo rates at each cap
    (:func:`fit_cap_cost`); records relative to the full GPU fit all six together.
    """
    if not _observations(records):
        raise InvalidInputError(
            "records", "contain no job with both solo_rate and colocated_rate", "measure some"
        )
    cap = fit_cap_cost(records)
    coefficients = list(fit_coefficients(records, cap_term=cap is None))
    if cap is not None:
        coefficients[_COLOCATION] = cap
    model = InterferenceModel(coefficients=tuple(coefficients), source=source)
    same_cap = cap is not None
    return InterferenceModel(
        coefficients=model.coefficients,
        source=source,
        mape_in_sample=mape(model, records, same_cap=same_cap),
        mape_held_out=held_out_mape(records, same_cap=same_cap) if len(records) > 2 else None,
        records=len(records),
        jobs=len(_observations(records)),
    )


def relative_errors(
    model: InterferenceModel, records: Sequence[ColocationRecord], *, same_cap: bool = False
) -> list[float]:
    """|predicted - measured| / measured slowdown of every job with both rates (``same_cap``:
    the records' slowdowns are relative to the job alone at its cap)."""
    errors: list[float] = []
    for record in records:
        for i, job in enumerate(record.jobs):
            measured = job.slowdown
            if measured is None:
                continue
            others = [(o.profile, o.thread_percent) for k, o in enumerate(record.jobs) if k != i]
            if same_cap:
                predicted = model.predict(job.profile, job.thread_percent, others)
            else:
                predicted = model.predict_vs_full_gpu(job.profile, job.thread_percent, others)
            errors.append(abs(predicted - measured) / measured)
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
    active = list(range(len(FEATURE_NAMES) if cap_term else _COLOCATION))
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


# --- admission -----------------------------------------------------------------------------


def tenant_threads(tenant: Tenant) -> int:
    return tenant.thread_percent if tenant.thread_percent is not None else tenant.percent


SHIELDED = MIN_BATCH_THREADS
"""A profiled batch pod that keeps at most this share of the SMs busy (GPU-percent) -- capped
at this many threads or fewer, or using no more alone (its SM utilization) -- runs at MPS
priority 1 and does not count against a latency pod's bound: measured on an H200, inference at
priority 0 and 100% threads kept its solo p99 beside ResNet-50 training capped at 50% (the
model knows nothing of priorities and predicted it slower)."""


def shielded(profile: PipeProfile | None, gpu_class: str, threads: int) -> bool:
    """True for a batch neighbour a latency pod's bound leaves out (:data:`SHIELDED`). A pod
    without a profile never is: nothing measured says it leaves half the GPU."""
    if gpu_class == CLASS_LATENCY or profile is None:
        return False
    return busy_share(profile, threads) <= SHIELDED / SLICES_PER_GPU


def reserved(profile: PipeProfile) -> PipeProfile:
    """A latency pod as its neighbours feel it: busy over its whole reserved share (it runs
    uncapped at MPS priority 0, and its bursts take SMs first), not at its average SM
    utilization -- an H200 inference service at 40 req/s averaged 2% of the SMs busy, and
    four small jobs at 50% threads beside it ran 2.2x their solo time where the model, told
    2%, predicted 1.8-1.9x at their caps."""
    return replace(profile, sm_utilization=None)


def charged_cap_cost(
    model: InterferenceModel, profile: PipeProfile, threads: int, bound: float
) -> float:
    """What admission charges a batch job for its thread cap: the model's cap cost
    (:meth:`InterferenceModel.cap_slowdown`), at most sqrt(``bound``) so the cap alone never
    takes more than half the bound (in log terms), and 1.0 for a profile without a measured SM
    utilization (the cap cost was fit on it; without it the estimate is too rough to refuse a
    placement on)."""
    if profile.sm_utilization is None:
        return 1.0
    return min(model.cap_slowdown(profile, threads), math.sqrt(bound))


def admit_reason(
    gpu: GpuState,
    demand: Demand,
    *,
    model: InterferenceModel,
    bounds: Mapping[str, float],
    charge_cap: bool = True,
) -> str | None:
    """None when nobody on ``gpu`` (newcomer included) is predicted past its class bound.

    ``bounds`` maps a class to the largest acceptable slowdown, e.g. ``{"latency": 1.15,
    "batch": 2.0}``; a class without a bound is not checked. Pods without a profile are assumed
    heavy (:data:`CONSERVATIVE_PROFILE`). A latency pod's slowdown leaves out its
    :data:`SHIELDED` batch neighbours (MPS priority protects it from them). A latency pod counts
    towards its neighbours as busy over its whole reserved share (:func:`reserved`).

    ``charge_cap`` (default): a batch pod's slowdown is taken against the pod alone on the whole
    GPU, the same-cap prediction x its thread cap's modelled cost (:func:`charged_cap_cost`),
    which is what its users see; without it, against the pod alone at its own cap. Why: on an
    H200 the same-cap bound let four small jobs at 50% caps share, and the LSTM among them ran
    2.04-2.20x its whole-GPU time (runs 5, 7, 8); charged, 1.66-1.95x (runs 7-10).
    """
    if not gpu.tenants:
        return None
    newcomer = demand.profile or CONSERVATIVE_PROFILE
    threads = assign_thread_percent(demand, gpu)
    # A latency pod runs uncapped for its bursts; to its neighbours it weighs its reserved share.
    loads = [
        (
            reserved(t.profile or CONSERVATIVE_PROFILE)
            if t.gpu_class == CLASS_LATENCY
            else t.profile or CONSERVATIVE_PROFILE,
            t.percent if t.gpu_class == CLASS_LATENCY else tenant_threads(t),
        )
        for t in gpu.tenants
    ]
    kept_out = [shielded(t.profile, t.gpu_class, tenant_threads(t)) for t in gpu.tenants]
    new_kept_out = shielded(demand.profile, demand.gpu_class, threads)
    bound = bounds.get(demand.gpu_class)
    if bound is not None:
        seen = loads
        if demand.gpu_class == CLASS_LATENCY:
            seen = [load for load, s in zip(loads, kept_out, strict=True) if not s]
        slowdown = model.predict(newcomer, threads, seen)
        if charge_cap and demand.gpu_class != CLASS_LATENCY:
            slowdown *= charged_cap_cost(model, newcomer, threads, bound)
        if slowdown > bound:
            unknown = "" if demand.profile else " (pod has no profile: assumed heavy)"
            return (
                f"predicted {slowdown:.2f}x slowdown for this {demand.gpu_class} pod beside "
                f"{len(gpu.tenants)} tenant(s), over its {bound:.2f}x bound{unknown}"
            )
    if demand.gpu_class == CLASS_LATENCY:
        threads = max(1, min(demand.percent, SLICES_PER_GPU))
        newcomer = reserved(newcomer)
    for i, tenant in enumerate(gpu.tenants):
        bound = bounds.get(tenant.gpu_class)
        if bound is None:
            continue
        others = [load for k, load in enumerate(loads) if k != i] + [(newcomer, threads)]
        if tenant.gpu_class == CLASS_LATENCY:
            flags = [s for k, s in enumerate(kept_out) if k != i] + [new_kept_out]
            others = [load for load, s in zip(others, flags, strict=True) if not s]
        own = tenant_threads(tenant)
        slowdown = model.predict(loads[i][0], own, others)
        if charge_cap and tenant.gpu_class != CLASS_LATENCY:
            slowdown *= charged_cap_cost(model, loads[i][0], own, bound)
        if slowdown > bound:
            return (
                f"would slow {tenant.gpu_class} pod {tenant.key} to {slowdown:.2f}x, "
                f"over its {bound:.2f}x bound"
            )
    return None


def gpu_loss(tenants: Sequence[tuple[float, PipeProfile, int]], model: InterferenceModel) -> float:
    """GPU-percent lost to interference on one GPU: sum of percent x (1 - 1/slowdown).

    ``tenants`` are (percent, profile, threads). The policy compares this before and after a
    placement, in the same unit as fragmentation, to weigh packing against harm.
    """
    if len(tenants) < 2:
        return 0.0
    loads = [load_of(profile, threads) for _, profile, threads in tenants]
    lost = 0.0
    for i, ((percent, _, _), load) in enumerate(zip(tenants, loads, strict=True)):
        others = sum_loads([other for k, other in enumerate(loads) if k != i])
        lost += percent * (1.0 - 1.0 / model.predict_load(load, others))
    return lost


def pair_throughput(
    model: InterferenceModel,
    first: tuple[PipeProfile, int],
    second: tuple[PipeProfile, int],
) -> float:
    """Work two jobs finish per second when run together, in units of one job alone on the
    whole GPU: ``1 / slowdown`` of each vs the whole GPU, summed (1.0 = no better than one
    after the other). On an H200, ResNet-50 and a transformer at 100/100 threads measured 1.10
    (predicted 1.09); an FP64 GEMM beside anything about 1.0 at best."""
    a, b = first, second
    return 1.0 / model.predict_vs_full_gpu(a[0], a[1], [b]) + 1.0 / model.predict_vs_full_gpu(
        b[0], b[1], [a]
    )
