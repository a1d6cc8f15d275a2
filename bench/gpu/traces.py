"""Job traces: arrivals over time, each job a kind and a fixed amount of work.

A trace is a file, so anyone can run their own mix (``python -m bench.gpu.run --trace FILE``):
a JSON list of objects, or a CSV file with a header row, one job per row::

    [{"arrival_s": 0.0, "kind": "resnet18", "work_s": 2.5},
     {"arrival_s": 0.4, "kind": "infer", "work_s": 5.0, "fraction": "0.25"},
     {"arrival_s": 0.6, "kind": "lstm", "work_s": 2.5, "fraction": "15%", "limit": "0.5"},
     {"arrival_s": 0.8, "kind": "resnet50", "work_s": 2.5, "opportunistic": true}]

    arrival_s,kind,work_s,fraction,limit,opportunistic
    0.0,resnet18,2.5,,,
    0.6,lstm,2.5,15%,0.5,
    0.8,resnet50,2.5,,,true

``arrival_s`` (also ``arrival``): seconds from the trace's start; ``kind``: a job kind of
``catalog.KINDS``; ``work_s`` (also ``work``): the job's intended solo duration, turned into
iterations (or requests) from the kind's solo rate measured in the same run and then fixed for
every scheme. Optional ``fraction``, ``limit`` and ``memory`` are the job's
``gpushare.io/gpu-fraction``, ``gpushare.io/gpu-limit`` and ``gpushare.io/gpu-memory`` as a user
writes them; without a fraction the job asks what the product sizes from its measured profile
(``fraction: auto``, ``sizing.request_fraction``), without a limit it gets gpushare's default,
without a memory the share of the GPU's memory its fraction is (on a GPU with little memory,
give small-fraction jobs a ``memory`` their model fits in: the results' ``peak_mib`` per job
says how much each used). Optional ``opportunistic`` (``true``/``false``) is the job's
``gpushare.io/opportunistic``. Every trace is run three ways under gpushare (issue 65): with
the chart's defaults (no pod opts in, ``gpushare``), with the opt-in on the rows the trace marks
(``gpushare_opportunistic``, where it marks any) and with every batch row opted in
(``gpushare_opportunistic_all``; docs/packing.md, "The sharing contract"). Mark about a third
of a trace's jobs: a real queue mixes jobs that may be preempted with jobs that may not.
The shipped traces are ``bench/gpu/data/traces/*.json`` (:data:`SHIPPED`).

A bad file fails before any GPU work, naming the file, the row and the field. A trace holds at
most ``MAX_ROWS`` jobs (every job's process is warmed up before the clock).
"""

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.gpu.catalog import KINDS
from bench.gpu.catalog import kind as job_kind
from gpushare.api.errors import InvalidInputError
from gpushare.api.limit import check_limit, parse_limit
from gpushare.api.names import ANN_FRACTION, ANN_OPPORTUNISTIC, CLASS_BATCH, SLICES_PER_GPU
from gpushare.api.quantities import parse_fraction, parse_memory
from gpushare.api.request import check_opportunistic, parse_opportunistic

SHIPPED_DIR = Path(__file__).resolve().parent / "data" / "traces"
SHIPPED = ("light", "heavy", "mixed", "bursty", "long-short", "notebooks")
"""The shipped traces: issue 8's three, then issue 65's (bursty arrivals, long jobs beside
short ones, notebooks that sit mostly idle beside batch jobs)."""
MAX_BYTES = 1 << 20
MAX_ROWS = 24
"""Jobs in one trace: each is a process and, under MPS, a client of one MPS server, which
serves at most 48 (CUDA's limit for Volta and newer). Which jobs are warmed up before the clock
is decided within that and the GPU's memory (``warmup.plan``); the others start cold, so a long
trace is not refused for memory, but split one that should run warm."""
MAX_ARRIVAL_S = 3600.0
MAX_WORK_S = 600.0
_ALIASES = {"arrival": "arrival_s", "work": "work_s"}
_FIELDS = ("arrival_s", "kind", "work_s", "fraction", "limit", "memory", "opportunistic")


class TraceError(ValueError):
    """A trace file the benchmark refuses; the message names the file, row and field."""


@dataclass(frozen=True)
class TraceJob:
    id: str
    kind: str
    arrival_s: float
    work_s: float
    fraction: float | None = None
    """The share the job asks for (``gpushare.io/gpu-fraction``): from the trace, else set per
    run by ``with_requests`` from the job's measured profile."""
    limit_percent: int | None = None
    """``gpushare.io/gpu-limit`` in GPU-percent, when the trace sets one."""
    memory_bytes: int | None = None
    """``gpushare.io/gpu-memory`` (its MPS pinned-memory limit), when the trace sets one; else
    the job gets the share of the GPU's memory its fraction is of the GPU, as in a cluster. On
    a GPU with little memory a small fraction may be too little for the job's model."""
    fixed_request: bool = False
    """True when the trace itself set the fraction (a run never resizes it)."""
    opportunistic: bool = False
    """``gpushare.io/opportunistic: "true"`` on the job's pod: honoured in the run with the
    opt-in (``gpushare_opportunistic``), ignored under the chart's default."""

    @property
    def gpu_class(self) -> str:
        return job_kind(self.kind).gpu_class

    @property
    def percent(self) -> int:
        if self.fraction is None:
            raise ValueError(f"{self.id}: no gpu-fraction set; call with_requests first")
        return max(1, min(100, round(self.fraction * 100)))


@dataclass(frozen=True)
class Trace:
    name: str
    jobs: tuple[TraceJob, ...]
    source: str
    """Where it came from (a path), for the results."""

    @property
    def work_s(self) -> float:
        return sum(j.work_s for j in self.jobs)


def _bad(where: str, field: str, problem: str, fix: str) -> TraceError:
    return TraceError(f"{where}: {field}: {problem}; {fix}")


def _number(value: Any, where: str, field: str, *, low: float, high: float, strict: bool) -> float:
    fix = f"write a number {'>' if strict else '>='} {low:g} and <= {high:g}"
    if isinstance(value, bool):
        raise _bad(where, field, f"{value!r} is not a number", fix)
    if isinstance(value, str):
        text = value.strip()
        if not text or len(text) > 16:
            raise _bad(where, field, f"{value[:20]!r} is not a number", fix)
        try:
            value = float(text)
        except ValueError:
            raise _bad(where, field, f"{text!r} is not a number", fix) from None
    if not isinstance(value, int | float):
        raise _bad(where, field, f"{value!r} is not a number", fix)
    number = float(value)
    if not math.isfinite(number) or number > high or number < low or (strict and number <= low):
        raise _bad(where, field, f"{value!r} is out of range", fix)
    return number


def _row(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise _bad(where, "row", "is not an object", 'write {"arrival_s": 0, "kind": ..., ...}')
    row = {_ALIASES.get(str(k), str(k)): v for k, v in raw.items()}
    unknown = sorted(k for k in row if k not in _FIELDS)
    if unknown:
        raise _bad(where, unknown[0], "is not a trace field", f"use only {', '.join(_FIELDS)}")
    for required in ("arrival_s", "kind", "work_s"):
        if row.get(required) in (None, ""):
            raise _bad(where, required, "is missing", f"give every row {required}")
    return row


def _job(row: dict[str, Any], *, name: str, index: int, where: str) -> TraceJob:
    arrival = _number(row["arrival_s"], where, "arrival_s", low=0, high=MAX_ARRIVAL_S, strict=False)
    work = _number(row["work_s"], where, "work_s", low=0, high=MAX_WORK_S, strict=True)
    kind = str(row["kind"]).strip()
    if kind not in KINDS:
        raise _bad(where, "kind", f"{kind[:40]!r} is unknown", f"use one of {', '.join(KINDS)}")
    fraction: float | None = None
    limit: int | None = None
    text = row.get("fraction")
    if text not in (None, ""):
        try:
            percent = parse_fraction(str(text)[:16], field="fraction")
        except InvalidInputError as exc:
            raise _bad(where, "fraction", exc.problem, exc.fix) from None
        if percent > SLICES_PER_GPU:
            raise _bad(where, "fraction", f"{text!r} is more than one GPU", "ask at most 1")
        fraction = percent / SLICES_PER_GPU
    text = row.get("limit")
    if text not in (None, ""):
        try:
            limit = parse_limit(str(text), field="limit")
            check_limit(limit, round((fraction or 0) * SLICES_PER_GPU), field="limit")
        except InvalidInputError as exc:
            problem = exc.problem.replace(ANN_FRACTION, "fraction")
            raise _bad(where, "limit", problem, exc.fix) from None
    memory: int | None = None
    text = row.get("memory")
    if text not in (None, ""):
        try:
            memory = parse_memory(str(text), field="memory")
        except InvalidInputError as exc:
            raise _bad(where, "memory", exc.problem, exc.fix) from None
    opted_in = False
    text = row.get("opportunistic")
    if text not in (None, ""):
        try:
            opted_in = bool(parse_opportunistic(str(text).lower(), field="opportunistic"))
            check_opportunistic(
                opted_in,
                percent=round((fraction or 0) * SLICES_PER_GPU),
                gpu_class=job_kind(kind).gpu_class,
                field="opportunistic",
            )
        except InvalidInputError as exc:
            problem = exc.problem.replace(ANN_OPPORTUNISTIC, "opportunistic")
            raise _bad(where, "opportunistic", problem, exc.fix) from None
    return TraceJob(
        f"{name}{index:02d}-{kind}",
        kind,
        arrival,
        work,
        fraction=fraction,
        limit_percent=limit,
        memory_bytes=memory,
        fixed_request=fraction is not None,
        opportunistic=opted_in,
    )


def parse_trace(text: str, *, name: str, source: str, csv_format: bool) -> Trace:
    """Validate a trace's text; TraceError names ``source``, the row and the field."""
    if len(text.encode()) > MAX_BYTES:
        raise TraceError(f"{source}: larger than {MAX_BYTES} bytes; split the trace")
    rows: list[tuple[Any, str]] = []
    if csv_format:
        reader = csv.DictReader(io.StringIO(text))
        header = [(_ALIASES.get(h.strip(), h.strip())) for h in reader.fieldnames or []]
        missing = [f for f in ("arrival_s", "kind", "work_s") if f not in header]
        if missing:
            header = "arrival_s,kind,work_s[,fraction,limit,memory,opportunistic]"
            raise _bad(f"{source}: line 1", missing[0], "is not a column",
                       f"start with a header row: {header}")  # fmt: skip
        for raw in reader:
            cleaned = {k.strip(): (v or "").strip() for k, v in raw.items() if k is not None}
            if None in raw:
                raise _bad(f"{source}: line {reader.line_num}", "row", "has more cells than the "
                           "header", "remove the extra cells")  # fmt: skip
            rows.append((cleaned, f"{source}: line {reader.line_num}"))
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{source}: not JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(data, list):
            raise TraceError(
                f'{source}: must be a JSON list of rows, e.g. [{{"arrival_s": 0, ...}}]'
            )
        rows = [(raw, f"{source}: row {i + 1}") for i, raw in enumerate(data)]
    if not rows:
        raise TraceError(f"{source}: has no jobs; add at least one row")
    if len(rows) > MAX_ROWS:
        raise TraceError(f"{source}: has {len(rows)} rows, more than {MAX_ROWS}; split it")
    jobs = [_job(_row(raw, where), name=name, index=i, where=where) for i, (raw, where) in
            enumerate(rows)]  # fmt: skip
    return Trace(name=name, jobs=tuple(jobs), source=source)


def load_trace(path: Path) -> Trace:
    """A trace file (``.json`` or ``.csv``), named after the file's stem."""
    if path.suffix.lower() not in (".json", ".csv"):
        raise TraceError(f"{path}: use a .json or .csv file")
    try:
        if path.stat().st_size > MAX_BYTES:
            raise TraceError(f"{path}: larger than {MAX_BYTES} bytes; split the trace")
        text = path.read_text()
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: is not UTF-8 text") from None
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in path.stem)[:40] or "trace"
    return parse_trace(text, name=name, source=str(path), csv_format=path.suffix.lower() == ".csv")


def shipped(name: str) -> Trace:
    """A shipped trace, its source named relative to the repository."""
    trace = load_trace(SHIPPED_DIR / f"{name}.json")
    return replace(trace, source=f"bench/gpu/data/traces/{name}.json")


def load_all(paths: Sequence[Path], names: Sequence[str] = ()) -> list[Trace]:
    """The traces to run: the given files and shipped traces by name, else every shipped one;
    names must differ."""
    unknown = [n for n in names if n not in SHIPPED]
    if unknown:
        raise TraceError(f"{unknown[0]!r} is not a shipped trace; use {', '.join(SHIPPED)}")
    if not paths and not names:
        names = SHIPPED
    found = [shipped(n) for n in names] + [load_trace(p) for p in paths]
    seen: dict[str, str] = {}
    for t in found:
        if t.name in seen:
            raise TraceError(f"{t.source}: same name {t.name!r} as {seen[t.name]}; rename one")
        seen[t.name] = t.source
    return found


def with_requests(jobs: Sequence[TraceJob], fractions: Mapping[str, float]) -> list[TraceJob]:
    """The jobs with each kind's requested fraction filled in where the trace set none."""
    missing = sorted({j.kind for j in jobs if not j.fixed_request} - set(fractions))
    if missing:
        raise ValueError(f"no requested fraction for job kinds {missing}")
    out = []
    for j in jobs:
        if j.fixed_request:
            out.append(j)
            continue
        # A trace limit below the sized request is raised to it, as assign_thread_percent does.
        out.append(replace(j, fraction=fractions[j.kind]))
    return out


def iterations_for(job: TraceJob, *, solo_rate: float) -> int:
    """Fixed work for ``job``: requests for the inference service, iterations otherwise."""
    spec = job_kind(job.kind)
    rate = spec.request_rate_hz if spec.poisson else solo_rate
    if rate <= 0:
        raise ValueError(f"{job.id}: solo rate of {job.kind} is {rate}; cannot size the job")
    return max(3, round(job.work_s * rate))


def every_batch_row_opted_in(jobs: Sequence[TraceJob]) -> list[TraceJob]:
    """The jobs with ``gpushare.io/opportunistic: "true"`` on every batch pod (a latency pod
    cannot opt in: ``check_opportunistic``), the trace's third way."""
    out = []
    for j in jobs:
        if j.gpu_class != CLASS_BATCH or j.opportunistic:
            out.append(j)
            continue
        check_opportunistic(True, percent=round((j.fraction or 0) * SLICES_PER_GPU),
                            gpu_class=j.gpu_class, field="opportunistic")  # fmt: skip
        out.append(replace(j, opportunistic=True))
    return out
