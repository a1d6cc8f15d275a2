"""The two job traces: arrivals over time, each job a fixed amount of work.

``work_s`` is the job's intended solo duration; the run turns it into iterations (or requests)
from the kind's solo rate measured at the start of the same run, then keeps that count fixed
for every scheme.
"""

from collections.abc import Mapping
from dataclasses import dataclass, replace

from bench.gpu.catalog import kind as job_kind


@dataclass(frozen=True)
class TraceJob:
    id: str
    kind: str
    arrival_s: float
    work_s: float
    fraction: float | None = None
    """The share the job asks for (``gpushare.io/gpu-fraction``); set per run by
    ``with_requests`` from the job's measured profile."""

    @property
    def gpu_class(self) -> str:
        return job_kind(self.kind).gpu_class

    @property
    def percent(self) -> int:
        if self.fraction is None:
            raise ValueError(f"{self.id}: no gpu-fraction set; call with_requests first")
        return max(1, min(100, round(self.fraction * 100)))


def _jobs(name: str, rows: list[tuple[float, str, float]], scale: float) -> list[TraceJob]:
    return [
        TraceJob(f"{name}{i:02d}-{kind}", kind, arrival * scale, work * scale)
        for i, (arrival, kind, work) in enumerate(rows)
    ]


def with_requests(jobs: list[TraceJob], fractions: Mapping[str, float]) -> list[TraceJob]:
    """The jobs with each kind's requested fraction filled in."""
    missing = sorted({j.kind for j in jobs} - set(fractions))
    if missing:
        raise ValueError(f"no requested fraction for job kinds {missing}")
    return [replace(j, fraction=fractions[j.kind]) for j in jobs]


def light(scale: float = 1.0) -> list[TraceJob]:
    """Mostly jobs that leave a Hopper GPU idle (small batches, an LSTM, an inference service),
    plus a few heavy ones (a transformer, a ResNet-50, an FP64 GEMM)."""
    rows = [
        (0.0, "resnet18", 2.5),
        (0.2, "lstm", 2.5),
        (0.4, "infer", 5.0),
        (0.6, "resnet18", 2.5),
        (0.8, "transformer", 2.5),
        (1.0, "resnet18", 2.5),
        (1.2, "lstm", 2.5),
        (1.4, "resnet18", 2.5),
        (1.6, "dgemm", 2.0),
        (1.8, "resnet18", 2.5),
        (2.0, "resnet50", 2.5),
    ]
    return _jobs("light", rows, scale)


def heavy(scale: float = 1.0) -> list[TraceJob]:
    """Jobs that each saturate the GPU: packing them only adds interference."""
    rows = [
        (0.0, "resnet50_xl", 3.0),
        (0.3, "transformer_xl", 3.0),
        (0.6, "dgemm", 3.0),
        (0.9, "resnet50_xl", 3.0),
        (1.2, "transformer_xl", 3.0),
    ]
    return _jobs("heavy", rows, scale)


TRACES = {"light": light, "heavy": heavy}


def iterations_for(job: TraceJob, *, solo_rate: float) -> int:
    """Fixed work for ``job``: requests for the inference service, iterations otherwise."""
    spec = job_kind(job.kind)
    rate = spec.request_rate_hz if spec.poisson else solo_rate
    if rate <= 0:
        raise ValueError(f"{job.id}: solo rate of {job.kind} is {rate}; cannot size the job")
    return max(3, round(job.work_s * rate))
