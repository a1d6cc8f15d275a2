"""The interference model on whole trace runs: each job's predicted against its measured stretch.

The model is fit on packs of two to four jobs measured in one-second windows (``colocate``).
Admission and opportunistic placement also ask it about stacks of five to ten jobs whose
neighbours come and go while the job runs. This checks that use on the GPU benchmark's stored
trace runs (``run*-results.json``): for every job of a shared scheme, its run time is cut at
every start and end of a neighbour; in each piece the product's :func:`opportunistic.rates`
(the model, each tenant at the thread cap and class it ran with, a latency service at its
reserved share) gives the job's rate; the time those rates need for the job's work (its
iterations over its solo rate) is its predicted run time. Measured: its run time. Both are
over its solo time, so >= 1 is a slowdown.

    python -m bench.gpu.trace_eval bench/gpu/data/run22-h100-results.json ... [--json OUT]

docs/packing.md, "The interference model on whole traces", has what it found.
"""

import argparse
import itertools
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.gpu.gpm import with_kernel_time
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import CLASS_BATCH, CLASS_LATENCY, SLICES_PER_GPU
from gpushare.packing.interference import InterferenceModel, load_default
from gpushare.packing.model import PipeProfile
from gpushare.packing.opportunistic import Member, rates
from gpushare.packing.stored_profile import counters_pipe_profile

SHARED_SCHEMES = (
    "gpushare",
    "gpushare_opportunistic",
    "gpushare_opportunistic_all",
    "mps_unlimited",
)
"""Schemes whose jobs share the GPU (exclusive FIFO runs one at a time: nothing to predict)."""
STACK_BINS = (1, 2, 3, 4, 5)
"""Upper ends (exclusive) of the stack sizes ``summary`` breaks the error down by: a job's mean
number of running neighbours over its run time; the last bin holds the rest."""
_REQUEST = re.compile(r"request (\d+)%")


@dataclass(frozen=True)
class Stretch:
    """One job of one run: its run time over its solo time, measured and predicted."""

    source: str
    trace: str
    scheme: str
    job: str
    kind: str
    measured: float
    predicted: float
    neighbours: float = 0.0
    """Running neighbours over its run time, on average (the stack it was predicted in)."""
    gpu: str = ""


def _member(
    job: Mapping[str, Any], profile: PipeProfile, *, scheme: str, fraction: float
) -> Member:
    threads = job.get("thread_percent") or SLICES_PER_GPU
    request = _REQUEST.search(str(job.get("note") or ""))
    percent = int(request.group(1)) if request else round(fraction * SLICES_PER_GPU)
    # MPS without limits gives every client the same priority: no class protects anyone.
    gpu_class = CLASS_BATCH if scheme == "mps_unlimited" else str(job.get("gpu_class", "batch"))
    return Member(profile, int(threads), gpu_class, max(1, percent), str(job.get("kind", "")))


def _ran(job: Mapping[str, Any]) -> bool:
    return not job.get("error") and job.get("start_s") is not None and job.get("end_s") is not None


def run_stretches(
    results: Mapping[str, Any], *, model: InterferenceModel, source: str = ""
) -> list[Stretch]:
    """Every batch job of every shared scheme of one results file (``details.jobs``)."""
    try:
        details = results["details"]
        raw = details.get("raw_profiles") or {}
        profiles = {
            k: counters_pipe_profile(with_kernel_time(v, raw.get(k)))
            for k, v in details["profiles"].items()
        }
        solo = details["solo_rates_mps"]
        fractions = details.get("requested_fractions", {})
        by_trace = details["jobs"]
    except (KeyError, TypeError, AttributeError) as exc:
        raise InvalidInputError(
            source or "results",
            f"not a GPU benchmark results file ({exc})",
            "give a run*-results.json the GPU benchmark wrote",
        ) from None
    gpu = str(results.get("gpu", ""))
    out: list[Stretch] = []
    for trace, schemes in by_trace.items():
        for scheme in SHARED_SCHEMES:
            jobs = [j for j in schemes.get(scheme) or [] if _ran(j) and j["kind"] in profiles]
            members = {
                id(j): _member(
                    j,
                    profiles[j["kind"]],
                    scheme=scheme,
                    fraction=float(fractions.get(j["kind"], 1.0)),
                )
                for j in jobs
            }
            for job in jobs:
                if job.get("gpu_class") == CLASS_LATENCY or not solo.get(job["kind"]):
                    continue
                predicted = _predicted_run_s(job, jobs, members, model)
                work_s = job["iterations"] / solo[job["kind"]]
                run_s = job["end_s"] - job["start_s"]
                if predicted is None or work_s <= 0 or run_s <= 0:
                    continue
                beside = _neighbours(job, jobs)
                out.append(Stretch(source, trace, scheme, job["id"], job["kind"],
                                   run_s / work_s, run_s / predicted, beside, gpu))  # fmt: skip
    return out


def _neighbours(job: Mapping[str, Any], jobs: Sequence[Mapping[str, Any]]) -> float:
    """The mean number of ``jobs`` running beside ``job`` over its run time."""
    start, end = job["start_s"], job["end_s"]
    if end <= start:
        return 0.0
    beside = sum(
        max(0.0, min(end, o["end_s"]) - max(start, o["start_s"])) for o in jobs if o is not job
    )
    return beside / (end - start)


def _stack(neighbours: float) -> str:
    """The :data:`STACK_BINS` label of a mean neighbour count."""
    low = 0
    for high in STACK_BINS:
        if neighbours < high:
            return f"{low}-{high - 1}" if high - 1 > low else str(low)
        low = high
    return f"{low}+"


def _predicted_run_s(
    job: Mapping[str, Any],
    jobs: Sequence[Mapping[str, Any]],
    members: Mapping[int, Member],
    model: InterferenceModel,
) -> float | None:
    """The work (in solo seconds) the model says ``job`` got done over its run time."""
    start, end = job["start_s"], job["end_s"]
    cuts = sorted(
        {start, end, *(t for o in jobs for t in (o["start_s"], o["end_s"]) if start < t < end)}
    )
    done = 0.0
    for a, b in itertools.pairwise(cuts):
        mid = (a + b) / 2
        others = [members[id(o)] for o in jobs if o is not job and o["start_s"] <= mid < o["end_s"]]
        done += (b - a) * rates([members[id(job)], *others], model)[0]
    return done if done > 0 else None


def summary(stretches: Iterable[Stretch], *, bound: float = 2.0) -> dict[str, Any]:
    """Per scheme: how many jobs, the mean log error (> 0: the model was pessimistic), MAPE of
    the stretch, the same for jobs measured past 1.5x, and at ``bound`` (the batch bound) the
    jobs measured past it but predicted within (missed) and the other way round (false alarms);
    ``by_stack``: jobs and mean log error by GPU and by how many neighbours ran beside the job
    on average (:data:`STACK_BINS`), where the model's error on stacks larger than the packs it
    is fit on shows."""
    out: dict[str, Any] = {}
    rows = list(stretches)
    for scheme in SHARED_SCHEMES:
        sub = [s for s in rows if s.scheme == scheme]
        if not sub:
            continue
        slow = [s for s in sub if s.measured > 1.5]
        out[scheme] = {
            "jobs": len(sub),
            "mean_log_error": _mean(math.log(s.predicted / s.measured) for s in sub),
            "mape": _mean(abs(s.predicted - s.measured) / s.measured for s in sub),
            "slow_jobs": len(slow),
            "slow_mape": _mean(abs(s.predicted - s.measured) / s.measured for s in slow),
            "missed_at_bound": sum(s.measured > bound >= s.predicted for s in sub),
            "false_alarms_at_bound": sum(s.predicted > bound >= s.measured for s in sub),
            "by_stack": _by_stack(sub),
        }
    return out


def _by_stack(rows: Sequence[Stretch]) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[Stretch]] = {}
    for s in rows:
        groups.setdefault(f"{s.gpu or '?'} {_stack(s.neighbours)}", []).append(s)
    return {
        key: {
            "jobs": len(group),
            "mean_log_error": _mean(math.log(s.predicted / s.measured) for s in group),
        }
        for key, group in sorted(groups.items())
    }


def _mean(values: Iterable[float]) -> float | None:
    seq = list(values)
    return round(sum(seq) / len(seq), 4) if seq else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="run*-results.json file(s)")
    parser.add_argument("--json", type=Path, default=None, help="write every job's figures here")
    args = parser.parse_args(argv)
    model = load_default()
    rows: list[Stretch] = []
    for path in args.results:
        try:
            rows += run_stretches(json.loads(path.read_text()), model=model, source=path.name)
        except (OSError, json.JSONDecodeError) as exc:
            print(f"cannot read {path}: {exc}", file=sys.stderr)
            return 2
        except InvalidInputError as exc:
            print(str(exc), file=sys.stderr)
            return 2
    result = summary(rows)
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(
            json.dumps({"summary": result, "jobs": [s.__dict__ for s in rows]}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
