"""How much slower a job runs beside its GPU neighbours: a small, inspectable linear model.

After KACE (kernel-aware colocation): the solo profiles of a job and of its neighbours become a
few features, and ``ln(slowdown)`` is their non-negative linear combination, so effects compose
multiplicatively. The features rest on the share of SMs each job keeps busy (its SM utilization
alone, no more than its MPS thread cap; without a measured SM utilization, the whole cap),
because that, not SM occupancy, is what launch-bound jobs contend for:

- ``time_share``: ``ln(max(1, busy of all))`` -- jobs that want more SMs than there are take
  turns;
- ``pair_dominance``: the turns the target takes with its busiest neighbour alone
  (``ln(max(1, its busy + that neighbour's))``) times how much larger that neighbour's share is
  than the target's (up to 3x): a job with small kernels waits behind one with large kernels.
  It is the busiest neighbour's doing, so more small neighbours do not multiply it (they take
  turns, which ``time_share`` counts);
- ``starvation``: how nearly the neighbours saturate a compute pipe (``STARVATION_POWER``) x
  how little of its own the target has, where thread caps overlap
  (``max(0, its cap + theirs - 100) / its cap``);
- ``neighbour_share``: the neighbours' SM share, up to the whole GPU (beyond it they take
  turns: ``time_share``);
- ``dram_contention``: product of DRAM bandwidth shares plus any oversubscription of it;
- ``cap_relief``: ``-(1 - its cap) x time_share``: caps partition the SMs, so a capped job
  waits less for its neighbours' turns;
- ``thread_cap``: the target's own cost of its MPS thread cap, ``demand x ln(100 / threads)``.

A target that saturates a pipe itself is shielded from the first, second and fourth terms
(``1 - min(1, its pipes)^4``), except by neighbours on the same pipe.

Both neighbour terms were read over the busiest neighbour and the whole GPU until the model
was checked against whole trace runs (stacks of five to ten jobs, where the packs it is fit on
hold two to four): summed over every neighbour they predicted 4-8x for small jobs that ran
1.2-1.7x slower, and held them back for nothing (docs/packing.md, "The interference model on
whole traces").

:meth:`InterferenceModel.predict` answers the colocation question: the slowdown relative to the
same job alone at the same cap, never below 1.0; :meth:`InterferenceModel.cap_slowdown` is the
cap's own cost. The coefficients ship in ``data/interference.json`` (:func:`load_default`) and
are fit by ``bench/gpu/fitting.py``. The measurements behind each term and the fit's accuracy:
docs/packing.md, "The interference model".
"""

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import SLICES_PER_GPU
from gpushare.packing.model import PipeProfile
from gpushare.packing.threads import compute_demand

FEATURE_NAMES: tuple[str, ...] = (
    "time_share",
    "pair_dominance",
    "starvation",
    "neighbour_share",
    "dram_contention",
    "cap_relief",
    "thread_cap",
)
COLOCATION_FEATURES = 6
"""The first six features describe the neighbours; the last one the target's own cap."""

WORK_CONSERVED = 1.0
"""Jobs' worth of work per second that jobs sharing a GPU uncapped (100% threads, no latency
pod among them) are predicted to do together, at least: MPS keeps the GPU busy with one job's
kernels while another's wait, so together they do not do less than one of them alone. Measured:
in every uncapped pack of two to four jobs stored from the H100 and H200 runs (960 jobs) the
total never fell below 0.97, while the model alone predicted less than one job's work for 127
of them (saturating jobs: two FP64 GEMMs, two batch-256 ResNet-50s); with this floor the same-cap
MAPE on those jobs fell from 0.179 to 0.164 (kinds the model never saw: 0.222 to 0.207;
docs/packing.md, "Work conservation")."""
IDLE_FILLED = 0.5
"""Share of the SM time a job alone leaves idle that uncapped neighbours are predicted to fill,
at least (:func:`idle_bound`): two training jobs each 90% SM-busy alone did 1.05-1.10 jobs'
worth together (run 26's overlap sets), where one job's work is all :data:`WORK_CONSERVED`
promises. Over the 461 uncapped packs stored from the H100 and H200 runs, the predicted work
of a pack is off the measured by 5.8% on average with the one-job floor alone, 4.7% with 0.5
(of the 197 packs it moves, 43 end above the measured: by 0.011 jobs' worth on average, 0.038
at most), 4.5% with 0.75 (but 239 packs above the measured, against 140) and 8.5% with 1
(docs/packing.md, "Work conservation")."""

_MIN_OCCUPANCY = 0.05
_MIN_BUSY = 0.01
DOMINANCE_CAP = 3.0
"""Largest ratio of the busiest neighbour's SM share to the target's that ``dominance`` counts."""
SATURATION_POWER = 4
"""``min(1, pipes)^4`` shields a target: near 1 only for a job that keeps a pipe almost fully
busy."""
STARVATION_POWER = 5
"""``min(1, neighbours' pipes)^5`` in ``starvation``: near 1 only beside a pipe-saturating
neighbour (an FP64 GEMM's 0.96 gives 0.82), about nothing beside a transformer's tensor share of
0.3 (0.002), so that fits without a pipe-saturating kind do not inflate starvation
(docs/packing.md, "The starvation power" and "Where the constants come from")."""


Load = tuple[float, float, float, float, float, float, float, float, float]
"""(occupancy, fp16, fp32, fp64, tensor, dram, cap, busy, largest busy) of one job or a sum of
jobs; cap = threads / 100, busy = share of SMs kept busy (summed; the last field is the largest
single job's)."""
_ZERO: Load = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


KERNEL_TIME_FIT = 0.3
"""The least share of its time with a kernel running (NVML utilization alone) among the batch
kinds the shipped model is fit on: ResNet-18, 0.32-0.61 on the H100s and H200s of runs 10-16;
the LSTM 0.52-0.77, the others 0.90-1.0 (``bench/gpu/data/run*-results.json``, raw profiles).
The model's slowdowns are those of jobs that keep a kernel on the GPU at least this much."""


def while_running(slowdown: float, profile: PipeProfile) -> float:
    """A batch job's slowdown over its run time from the model's ``slowdown``: a job whose
    kernels run less of its time than :data:`KERNEL_TIME_FIT` (one that sleeps between bursts,
    as a notebook does between cells) is slowed only while they run, in proportion:
    ``1 + (slowdown - 1) x utilization / KERNEL_TIME_FIT``. Unchanged without a measured
    kernel time. Not for a latency pod: each of its requests is slowed whole
    (docs/packing.md, "Jobs that sleep")."""
    if profile.utilization is None or slowdown <= 1.0:
        return slowdown
    running = min(1.0, max(profile.utilization, 0.0) / KERNEL_TIME_FIT)
    return 1.0 + (slowdown - 1.0) * running


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

    Busy is its SM utilization where measured (what a cap takes away; docs/packing.md, "The
    interference model"), else its compute demand."""
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
    pair_turns = math.log(max(1.0, b_t + b_max))
    bigger = max(0.0, min(DOMINANCE_CAP, b_max / max(b_t, _MIN_BUSY)) - 1.0)
    shared = min(1.0, max(0.0, c_t + c_n - 1.0) / c_t) if c_t > 0 else 0.0
    starve = shared * min(1.0, pipes_n) ** STARVATION_POWER * max(0.0, 1.0 - pipes_t)
    dram = m_t * m_n + max(0.0, m_t + m_n - 1.0)
    time_share = exposed * turns
    return (
        time_share,
        exposed * pair_turns * bigger,
        starve,
        exposed * min(1.0, b_n),
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


def idle_bound(busy: Sequence[float | None]) -> float:
    """Jobs' worth of work jobs whose SMs are ``busy`` that share alone (SM utilization alone,
    0-1) would do together if SM time were all they shared and went to the busiest first: each
    in turn runs at its full rate on the SM time left, until none is left. None anywhere (not
    measured): :data:`WORK_CONSERVED`. Two jobs 90% busy: 1.11; two 20% busy: 2."""
    if any(b is None for b in busy):
        return WORK_CONSERVED
    left, work = 1.0, 0.0
    for b in sorted((max(float(b or 0.0), _MIN_BUSY) for b in busy), reverse=True):
        used = min(b, left)
        work += used / b
        left -= used
    return max(work, WORK_CONSERVED)


def conserve_work(
    slowdowns: Sequence[float],
    threads: Sequence[int],
    busy: Sequence[float | None] | None = None,
) -> list[float]:
    """The same-cap slowdowns of the jobs sharing one GPU (``threads``: their MPS thread caps;
    ``busy``: their SM utilization alone, None where not measured), lowered together in
    proportion where the jobs all run uncapped and were predicted to do less work together
    than :data:`WORK_CONSERVED` jobs' worth plus :data:`IDLE_FILLED` of what the SM time they
    leave idle would add (:func:`idle_bound`). Capped jobs keep the model's slowdowns: alone
    at their caps they are slower than alone on the whole GPU, so the floor does not hold for
    them."""
    if len(slowdowns) < 2 or any(t < SLICES_PER_GPU for t in threads):
        return list(slowdowns)
    floor = WORK_CONSERVED
    if busy is not None:
        floor += IDLE_FILLED * (idle_bound(busy) - WORK_CONSERVED)
    total = sum(1.0 / s for s in slowdowns)
    if total >= floor:
        return list(slowdowns)
    scale = total / floor
    return [max(1.0, s * scale) for s in slowdowns]


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
        return self.from_features(x)

    def predict_pack(self, members: Sequence[tuple[PipeProfile, int]]) -> list[float]:
        """Each member's :meth:`predict` beside the others (``members``: profile, threads of
        the batch jobs sharing one GPU), with :func:`conserve_work`'s floor."""
        raw = [
            self.predict(profile, threads, [*members[:i], *members[i + 1 :]])
            for i, (profile, threads) in enumerate(members)
        ]
        return conserve_work(
            raw,
            [threads for _, threads in members],
            [profile.sm_utilization for profile, _ in members],
        )

    def predict_load(self, target: Load, neighbours: Load) -> float:
        """:meth:`predict` from precomputed loads (``neighbours`` summed)."""
        if neighbours[6] <= 0.0 and neighbours[7] <= 0.0:
            return 1.0
        return self.from_features(features_from(target, neighbours))

    def from_features(self, x: Sequence[float]) -> float:
        """The colocation slowdown (>= 1.0) for the first six features ``x`` (:func:`features`)."""
        c = self.coefficients
        z = c[0] * x[0] + c[1] * x[1] + c[2] * x[2] + c[3] * x[3] + c[4] * x[4] + c[5] * x[5]
        return math.exp(z) if z > 0 else 1.0

    def cap_slowdown(self, target: PipeProfile, threads: int) -> float:
        """Slowdown of ``target`` alone at ``threads`` relative to alone at 100% threads."""
        return math.exp(self.coefficients[COLOCATION_FEATURES] * cap_feature(target, threads))

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
        if names != FEATURE_NAMES:
            # A file fit with other features (before cap_relief, or with dominance and
            # neighbour_busy read over every neighbour) would be read with the wrong meaning.
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


MODEL_ENV = "GPUSHARE_INTERFERENCE_MODEL"
"""Path of a model file (the shipped format, e.g. one ``bench/sim/fit_interference.py
--calibrate`` wrote from colocations measured on your GPUs) that replaces the shipped one in
the process that reads it; unset or empty: the shipped model (docs/packing.md, "Calibrating on
your GPUs")."""


@lru_cache(maxsize=1)
def load_default() -> InterferenceModel:
    """The model the placement, admission and protection use: the file named by
    ``$GPUSHARE_INTERFERENCE_MODEL`` when set, else the one shipped in
    ``gpushare/packing/data/interference.json``. A file that cannot be read or parsed is
    refused naming the variable, never replaced silently by the shipped model."""
    path = os.environ.get(MODEL_ENV, "").strip()
    if not path:
        text = resources.files("gpushare.packing").joinpath("data/interference.json").read_text()
        return InterferenceModel.from_dict(json.loads(text), origin="interference.json")
    fix = f"point {MODEL_ENV} at a model JSON file, or unset it for the shipped model"
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInputError(MODEL_ENV, f"cannot read {path!r} ({exc})", fix) from None
    if not isinstance(raw, dict):
        raise InvalidInputError(MODEL_ENV, f"{path!r} is not a JSON object", fix)
    return InterferenceModel.from_dict(raw, origin=f"{MODEL_ENV} ({path})")
