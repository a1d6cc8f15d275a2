"""Colocation measurements: which packs to run, the data file they become, and how well a
packing model does on them.

The data file ``bench/gpu/data/colocations.json`` is what gpushare's interference model is fit
from. It is a list of packs::

    [{"gpu": "NVIDIA H100 80GB HBM3",
      "jobs": [{"name": "resnet18",
                "profile": {"fp16": 0.0, "fp32": 0.21, "fp64": 0.0, "tensor": 0.05,
                            "sm_occupancy": 0.18, "dram_bandwidth": 0.07},
                "thread_percent": 50,
                "solo_rate": 180.2,
                "colocated_rate": 150.9}, ...]}, ...]

``profile`` is the job's solo profile (0-1, measured alone at 100% threads; ``sm_utilization``,
the share of SMs busy, is optional and recorded when GPM measured it), ``solo_rate`` its
iterations/s alone at 100% threads under MPS, ``colocated_rate`` its iterations/s in this pack
with ``thread_percent`` active threads. A pack of one job at less than 100% threads measures
the thread cap alone.
"""

import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.gpu.gpm import OPTIONAL_PROFILE_KEYS, PROFILE_KEYS
from bench.gpu.stats import mape

Record = dict[str, Any]
"""One pack as stored in colocations.json."""


@dataclass(frozen=True)
class Member:
    """One client process in a pack: a job kind at a thread percentage (copy tells twins apart)."""

    kind: str
    thread_percent: int
    copy: int = 0

    @property
    def label(self) -> str:
        return f"{self.kind}@{self.thread_percent}#{self.copy}"


Pack = tuple[Member, ...]


@dataclass(frozen=True)
class Stage:
    """Packs measured with one set of live worker processes."""

    name: str
    packs: tuple[Pack, ...]
    window_s: float

    @property
    def members(self) -> set[Member]:
        return {m for p in self.packs for m in p}


def _pack(*items: tuple[str, int]) -> Pack:
    """Members for (kind, pct) items, numbering twins so each is its own process."""
    seen: Counter[tuple[str, int]] = Counter()
    out = []
    for kind, pct in items:
        out.append(Member(kind, pct, seen[(kind, pct)]))
        seen[(kind, pct)] += 1
    return tuple(out)


def plan(kinds: Sequence[str], *, quick: bool) -> list[Stage]:
    """The measurement plan: solo profiles, pairs at 100/100, 50/50 and mixed caps, and
    larger packs. The first stage's singles are the solo profiles and solo rates."""
    window = 0.8 if quick else 1.0
    profile_window = 1.5 if quick else 2.0
    pairs = list(itertools.combinations_with_replacement(kinds, 2))
    light = [k for k in ("resnet18", "lstm") if k in kinds]
    heavy = [k for k in kinds if k not in light]

    solo = tuple(_pack((k, 100)) for k in kinds)
    full = [_pack((a, 100), (b, 100)) for a, b in pairs]
    if len(light) == 2 and not quick:  # launch-bound jobs stacked: how many fit uncapped
        r18, lstm = light
        full += [
            _pack((r18, 100), (r18, 100), (r18, 100)),
            _pack((r18, 100), (r18, 100), (lstm, 100)),
            _pack((r18, 100), (r18, 100), (lstm, 100), (lstm, 100)),
        ]
    stages = [Stage("solo", solo, profile_window), Stage("full-threads", tuple(full), window)]

    capped: list[Pack] = [_pack((k, 50)) for k in kinds] + [_pack((k, 25)) for k in kinds]
    capped += [_pack((a, 50), (b, 50)) for a, b in pairs]
    mixed = [(a, b) for a, b in itertools.permutations(kinds, 2) if a in light or b in light]
    capped += [_pack((a, 25), (b, 50)) for a, b in (mixed[::2] if quick else mixed)]
    if len(light) == 2 and heavy:
        r18, lstm = light
        capped += [
            _pack((r18, 25), (r18, 25), (r18, 25), (r18, 25)),
            _pack((r18, 25), (r18, 25), (lstm, 25), (lstm, 25)),
            _pack((r18, 25), (lstm, 25), *((h, 25) for h in heavy[:2])),
            _pack((r18, 25), (r18, 25), (lstm, 25), (heavy[0], 25)),
            _pack((r18, 50), (r18, 50), (r18, 50), (r18, 50)),
            _pack((r18, 50), (r18, 50), (lstm, 50), (lstm, 50)),
        ]
        capped += [_pack((h, 50), (r18, 25), (lstm, 25)) for h in heavy]
        if len(heavy) >= 3:
            capped.append(_pack(*((h, 25) for h in heavy[:3]), (r18, 25)))
    if quick:  # keep every single (they are the solo rates at each cap), halve the packs
        capped = [p for p in capped if len(p) == 1] + [p for p in capped if len(p) > 1][::2]
    stages.append(Stage("capped", tuple(capped), window))
    return stages


def unseen_plan(unseen: Sequence[str], known: Sequence[str], *, window: float) -> list[Stage]:
    """Packs of the kinds the shipped model never saw: each beside every known kind and beside
    each other at 100/100, and beside every known kind at 50/50 (with each alone at 50%, for
    its solo rate at that cap), in two stages so each holds few processes."""
    full = [_pack((u, 100), (k, 100)) for u in unseen for k in known]
    full += [_pack((a, 100), (b, 100)) for a, b in itertools.combinations(unseen, 2)]
    half = [_pack((u, 50)) for u in unseen]
    half += [_pack((u, 50), (k, 50)) for u in unseen for k in known]
    return [Stage("unseen-full", tuple(full), window), Stage("unseen-half", tuple(half), window)]


@dataclass(frozen=True)
class PackResult:
    pack: Pack
    rates: tuple[float, ...]
    """Iterations/s of each member, in pack order, measured while all ran together."""


def solo_table(results: Sequence[PackResult]) -> dict[tuple[str, int], float]:
    """Rate of each (kind, thread %) alone, from the single-job packs (mean of repeats)."""
    seen: dict[tuple[str, int], list[float]] = {}
    for r in results:
        if len(r.pack) == 1:
            m = r.pack[0]
            seen.setdefault((m.kind, m.thread_percent), []).append(r.rates[0])
    return {k: sum(v) / len(v) for k, v in seen.items()}


def records(
    *,
    gpu: str,
    results: Sequence[PackResult],
    profiles: dict[str, dict[str, float]],
) -> list[Record]:
    """The colocations.json data for the measured multi-job packs.

    ``solo_rate`` is the job's rate alone at the same thread cap (single-job packs of the same
    run), as gpushare's interference model defines slowdown; a pack with a member whose solo
    rate at that cap was not measured is left out.
    """
    solo = solo_table(results)
    out: list[Record] = []
    for r in results:
        if len(r.pack) < 2:
            continue
        if any((m.kind, m.thread_percent) not in solo or m.kind not in profiles for m in r.pack):
            continue
        jobs = [
            {
                "name": m.kind,
                "profile": {
                    k: round(float(profiles[m.kind].get(k, 0.0)), 4)
                    for k in PROFILE_KEYS + OPTIONAL_PROFILE_KEYS
                    if k in PROFILE_KEYS or k in profiles[m.kind]
                },
                "thread_percent": m.thread_percent,
                "solo_rate": round(solo[(m.kind, m.thread_percent)], 4),
                "colocated_rate": round(rate, 4),
            }
            for m, rate in zip(r.pack, r.rates, strict=True)
        ]
        out.append({"gpu": gpu, "jobs": jobs})
    return out


def validate(data: Any) -> list[Record]:
    """Check the colocations.json format; ValueError names the bad field and the fix."""

    def bad(where: str, problem: str) -> ValueError:
        return ValueError(
            f"colocations{where}: {problem}; see bench/gpu/colocate.py for the format"
        )

    if not isinstance(data, list):
        raise bad("", "must be a JSON list of packs")
    for i, pack in enumerate(data):
        if not isinstance(pack, dict) or set(pack) != {"gpu", "jobs"}:
            raise bad(f"[{i}]", 'must be an object with exactly "gpu" and "jobs"')
        if not isinstance(pack["gpu"], str) or not pack["gpu"]:
            raise bad(f"[{i}].gpu", "must be the GPU model name")
        if not isinstance(pack["jobs"], list) or not pack["jobs"]:
            raise bad(f"[{i}].jobs", "must be a non-empty list")
        for j, job in enumerate(pack["jobs"]):
            where = f"[{i}].jobs[{j}]"
            keys = {"name", "profile", "thread_percent", "solo_rate", "colocated_rate"}
            if not isinstance(job, dict) or set(job) != keys:
                raise bad(where, f"must have exactly the keys {sorted(keys)}")
            prof = job["profile"]
            if not isinstance(prof, dict) or not (
                set(PROFILE_KEYS) <= set(prof) <= set(PROFILE_KEYS + OPTIONAL_PROFILE_KEYS)
            ):
                raise bad(
                    f"{where}.profile",
                    f"must have exactly {list(PROFILE_KEYS)}, optionally "
                    f"{list(OPTIONAL_PROFILE_KEYS)}",
                )
            for k, v in prof.items():
                if not isinstance(v, int | float) or not 0 <= v <= 1:
                    raise bad(f"{where}.profile.{k}", f"{v!r} is not a number in 0..1")
            tp = job["thread_percent"]
            if not isinstance(tp, int) or isinstance(tp, bool) or not 1 <= tp <= 100:
                raise bad(f"{where}.thread_percent", f"{tp!r} is not an integer 1..100")
            for k in ("solo_rate", "colocated_rate"):
                v = job[k]
                if not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                    raise bad(f"{where}.{k}", f"{v!r} is not a finite rate >= 0")
            if job["solo_rate"] <= 0:
                raise bad(f"{where}.solo_rate", "must be > 0 (the job ran alone)")
    return data


def retained(job: Record) -> float:
    """Share of its solo speed at the same cap that a job kept in the pack."""
    return float(job["colocated_rate"]) / float(job["solo_rate"])


Predictor = Callable[[Record], list[float]]
"""Predicted retained ratio (colocated / solo rate) of each job of a pack."""


def folds(data: Sequence[Record], k: int) -> list[tuple[list[Record], list[Record]]]:
    """Deterministic k-fold split by pack (every k-th pack held out in turn)."""
    k = max(2, min(k, len(data)))
    return [
        (
            [p for i, p in enumerate(data) if i % k != f],
            [p for i, p in enumerate(data) if i % k == f],
        )
        for f in range(k)
    ]


def held_out_mape(
    data: Sequence[Record], *, fit: Callable[[list[Record]], Predictor], k: int = 5
) -> dict[str, float]:
    """Prediction error on packs the model was not fit on (k-fold by pack).

    ``mape_slowdown``: of the slowdown (solo rate at the cap / colocated rate), the quantity
    gpushare's model predicts and admission compares with class bounds. ``mape_rate``: of the
    colocated rate itself, which punishes over-prediction of a nearly starved job hard.
    """
    slow: list[tuple[float, float]] = []
    rate: list[tuple[float, float]] = []
    for train, test in folds(data, k):
        predict = fit(train)
        for pack in test:
            for job, pred in zip(pack["jobs"], predict(pack), strict=True):
                actual = retained(job)
                if actual <= 0 or pred <= 0:
                    continue
                slow.append((1.0 / pred, 1.0 / actual))
                rate.append((pred * float(job["solo_rate"]), float(job["colocated_rate"])))
    return {
        "mape_slowdown": mape(slow) if slow else float("nan"),
        "mape_rate": mape(rate) if rate else float("nan"),
        "predictions": float(len(slow)),
        "folds": float(max(2, min(k, len(data)))),
    }


PackKey = tuple[tuple[str, int], ...]
"""A pack as sorted (kind, thread %) pairs."""


def pack_key(members: Iterable[tuple[str, int]]) -> PackKey:
    return tuple(sorted(members))


def key_of(record: Record) -> PackKey:
    return pack_key((str(j["name"]), int(j["thread_percent"])) for j in record["jobs"])


def _kinds(key: PackKey) -> Counter[str]:
    return Counter(k for k, _ in key)


def scenarios(data: Sequence[Record]) -> list[PackKey]:
    """Each distinct set of job kinds measured together (as a key with 100% placeholders)."""
    seen = {pack_key((k, 100) for k, _ in key_of(p)) for p in data if len(p["jobs"]) > 1}
    return sorted(seen)


def tables(data: Sequence[Record]) -> tuple[dict[str, float], dict[tuple[str, int], float]]:
    """(rate alone at 100% per kind, rate alone per (kind, cap)) as recorded in the data."""
    capped: dict[tuple[str, int], list[float]] = {}
    for p in data:
        for j in p["jobs"]:
            capped.setdefault((str(j["name"]), int(j["thread_percent"])), []).append(
                float(j["solo_rate"])
            )
    at_cap = {k: sum(v) / len(v) for k, v in capped.items()}
    full = {k: r for (k, tp), r in at_cap.items() if tp == 100}
    return full, at_cap


def pack_value(
    key: PackKey, data_by_key: dict[PackKey, Record], at_cap: dict[tuple[str, int], float]
) -> tuple[float, float] | None:
    """(normalised throughput, slowest job's share of its full solo speed) of a measured pack;
    throughput is the sum over jobs of rate / rate alone at 100% threads. None if unmeasured."""
    full = {k: r for (k, tp), r in at_cap.items() if tp == 100}
    if len(key) == 1:
        kind, tp = key[0]
        if kind not in full or (kind, tp) not in at_cap:
            return None
        share = at_cap[(kind, tp)] / full[kind]
        return share, share
    record = data_by_key.get(key)
    if record is None or any(str(j["name"]) not in full for j in record["jobs"]):
        return None
    shares = [float(j["colocated_rate"]) / full[str(j["name"])] for j in record["jobs"]]
    return sum(shares), min(shares)


def exhaustive_comparison(
    data: Sequence[Record],
    *,
    chosen: dict[PackKey, PackKey],
    solo: dict[tuple[str, int], float] | None = None,
    min_share: float = 0.5,
    fractions: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """How close the packs a policy chose come to the best measured ones.

    For each scenario S (a set of jobs measured together), the candidates are every measured
    pack of a subset of S, at any thread caps, and each job alone. The exhaustive best is the
    candidate with the highest normalised throughput in which no job fell below ``min_share``
    of its full solo speed (no job more than 2x slower). ``chosen[S]`` is the pack the policy
    formed from S. Returns the mean over scenarios of chosen/best throughput. ``solo`` adds
    rates alone per (kind, cap) to those the records carry. With ``fractions`` (the share each
    kind asked for) it also returns the same mean against the best pack the requests allow
    (requested fractions summing to at most 1, or a job alone): the policy's choice among the
    packings it may form, apart from what honouring whole-GPU requests costs.
    """
    by_key = {key_of(p): p for p in data}
    at_cap = {**tables(data)[1], **(solo or {})}
    singles = {((k, tp),) for k, tp in at_cap}
    ratios: list[float] = []
    allowed_ratios: list[float] = []
    below = 0
    details: list[dict[str, Any]] = []

    def allowed(cand: PackKey) -> bool:
        return fractions is not None and (
            len(cand) == 1 or sum(fractions.get(k, 1.0) for k, _ in cand) <= 1.0 + 1e-9
        )

    for scen, pick in sorted(chosen.items()):
        kinds = _kinds(scen)
        best = best_allowed = 0.0
        for cand in list(by_key) + sorted(singles):
            if _kinds(cand) - kinds:
                continue
            v = pack_value(cand, by_key, at_cap)
            if v is not None and v[1] >= min_share:
                best = max(best, v[0])
                if allowed(cand):
                    best_allowed = max(best_allowed, v[0])
        got = pack_value(pick, by_key, at_cap)
        if got is None or best <= 0:
            details.append({"scenario": scen, "chosen": pick, "note": "not measured"})
            continue
        if got[1] < min_share:
            below += 1
        ratios.append(min(got[0] / best, 1.0))
        row = {
            "scenario": "+".join(k for k, _ in scen),
            "chosen": "+".join(f"{k}@{tp}" for k, tp in pick),
            "chosen_throughput": round(got[0], 3),
            "best_throughput": round(best, 3),
        }
        if best_allowed > 0:
            allowed_ratios.append(min(got[0] / best_allowed, 1.0))
            row["best_within_requests"] = round(best_allowed, 3)
        details.append(row)
    return {
        "packing_vs_exhaustive": sum(ratios) / len(ratios) if ratios else None,
        "packing_vs_exhaustive_within_requests": (
            sum(allowed_ratios) / len(allowed_ratios) if allowed_ratios else None
        ),
        "scenarios": len(ratios),
        "chosen_with_a_job_below_half_speed": below,
        "details": details,
    }
