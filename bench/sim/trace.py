"""Read the openb trace CSVs (Alibaba cluster-trace-gpu-v2023) in place, or a list shaped like them.

Node list: ``sn, cpu_milli, memory_mib, gpu, model``. Pod lists: ``name, cpu_milli,
memory_mib, num_gpu, gpu_milli`` plus optional ``gpu_spec`` (allowed models, ``|``-separated)
and ``qos``. ``gpu_milli`` is the share of one GPU in thousandths for single-GPU pods; the
simulator works in GPU-percent, so it must be a multiple of 10 (it is, in every openb list).

Both the simulator and the replay through a real control plane (``bench/replay``) read lists
through here, and the replay turns node names and GPU models into Kubernetes names and labels:
so every row is checked before anything is done with it, and a bad one is refused naming the
file, the line and the field (``openb_pod_list_x.csv line 12, gpu_milli: ...``).
"""

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from gpushare.api.errors import InvalidInputError

GPU_MEMORY_GIB = {"T4": 16, "P100": 16, "V100M16": 16, "V100M32": 32, "A10": 24}
"""Per-GPU memory by model (G1-G3 are undisclosed; taken as 32 GiB). Only used for the
proportional GPU-memory share, which never binds in these traces."""
DEFAULT_GPU_MEMORY_GIB = 32

MAX_ROWS = 1_000_000
MAX_CPU_MILLI = 10_000_000
"""10,000 cores: more than any node or pod has."""
MAX_MEMORY_MIB = 1 << 30
"""1 PiB."""
MAX_GPUS = 64
MAX_MODELS = 16
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")
"""A node name that is also a valid label value (``kubernetes.io/hostname``)."""
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_INTEGER = re.compile(r"^[+-]?[0-9]{1,15}$")


@dataclass(frozen=True)
class NodeSpec:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class PodSpec:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    percent: int
    """Per-GPU share in GPU-percent: gpu_milli / 10 (100 for each GPU of a multi-GPU pod)."""
    gpu_spec: str
    qos: str

    @property
    def gpu_percent_total(self) -> int:
        return self.percent * self.num_gpu

    @property
    def shape(self) -> tuple[int, int, int, int, str]:
        """What placement depends on: (cpu, memory, GPUs, percent, allowed models)."""
        return (self.cpu_milli, self.memory_mib, self.num_gpu, self.percent, self.gpu_spec)

    @property
    def models(self) -> tuple[str, ...]:
        """The GPU models the pod may use (empty: any)."""
        return tuple(m for m in self.gpu_spec.split("|") if m)


def gpu_memory_bytes(model: str) -> int:
    return GPU_MEMORY_GIB.get(model, DEFAULT_GPU_MEMORY_GIB) << 30


class _Row:
    """One CSV row and where it came from, for errors that name file, line and field."""

    def __init__(self, path: Path, line: int, values: dict[str | None, object]) -> None:
        self.path, self.line, self.values = path, line, values

    def where(self, key: str) -> str:
        return f"{self.path.name} line {self.line}, {key}"

    def text(self, key: str, *, required: bool = True) -> str:
        raw = self.values.get(key)
        value = raw.strip() if isinstance(raw, str) else ""
        if required and not value:
            raise InvalidInputError(self.where(key), "is empty", "fill it in or drop the row")
        return value

    def integer(self, key: str, *, low: int, high: int, required: bool = True) -> int:
        raw = self.text(key, required=required)
        if not raw:
            return 0
        if not _INTEGER.match(raw):
            raise InvalidInputError(
                self.where(key), f"{raw[:40]!r} is not a whole number", "write an integer"
            )
        value = int(raw)
        if not low <= value <= high:
            raise InvalidInputError(
                self.where(key), f"{value} is outside {low}..{high}", "fix the value"
            )
        return value


def _rows(path: Path, required: tuple[str, ...]) -> list[_Row]:
    if not path.is_file():
        raise InvalidInputError(
            str(path), "does not exist", "pass --traces pointing at the openb CSV directory"
        )
    rows: list[_Row] = []
    with path.open(newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.DictReader(f)
        missing = [k for k in required if k not in (reader.fieldnames or [])]
        if missing:
            raise InvalidInputError(
                f"{path.name} line 1",
                f"lacks columns {missing}",
                "use an openb node/pod list CSV (header line first)",
            )
        try:
            for row in reader:
                line = reader.line_num
                if None in row:
                    raise InvalidInputError(
                        f"{path.name} line {line}",
                        "has more fields than the header",
                        "remove the extra fields (a value with a comma must be quoted)",
                    )
                if len(rows) >= MAX_ROWS:
                    raise InvalidInputError(
                        f"{path.name} line {line}",
                        f"more than {MAX_ROWS} rows",
                        "split the list",
                    )
                rows.append(_Row(path, line, dict(row)))
        except csv.Error as exc:
            raise InvalidInputError(
                f"{path.name} line {reader.line_num}", f"is not CSV ({exc})", "fix the line"
            ) from None
    return rows


def load_nodes(path: Path) -> list[NodeSpec]:
    """GPU nodes of a node list (CPU-only rows are skipped: the experiment uses GPU nodes)."""
    nodes: list[NodeSpec] = []
    seen: set[str] = set()
    for row in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
        name = row.text("sn")
        if not _NODE_NAME.match(name):
            raise InvalidInputError(
                row.where("sn"),
                f"{name[:80]!r} is not a node name",
                "use lower-case letters, digits, '-' and '.', at most 63 characters",
            )
        if name in seen:
            raise InvalidInputError(row.where("sn"), f"{name!r} appears twice", "name nodes once")
        seen.add(name)
        gpus = row.integer("gpu", low=0, high=MAX_GPUS)
        if gpus == 0:
            continue
        model = row.text("model")
        if not _LABEL_VALUE.match(model):
            raise InvalidInputError(
                row.where("model"),
                f"{model[:80]!r} is not a GPU model name",
                "use letters, digits, '-', '_' and '.', at most 63 characters",
            )
        nodes.append(
            NodeSpec(
                name=name,
                cpu_milli=row.integer("cpu_milli", low=1, high=MAX_CPU_MILLI),
                memory_mib=row.integer("memory_mib", low=1, high=MAX_MEMORY_MIB),
                gpus=gpus,
                model=model,
            )
        )
    if not nodes:
        raise InvalidInputError(str(path), "has no GPU nodes", "use openb_node_list_gpu_node.csv")
    return nodes


def load_pods(path: Path) -> list[PodSpec]:
    pods: list[PodSpec] = []
    seen: set[str] = set()
    for row in _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu")):
        name = row.text("name")
        if not _LABEL_VALUE.match(name):
            raise InvalidInputError(
                row.where("name"),
                f"{name[:80]!r} is not a pod name",
                "use letters, digits, '-', '_' and '.', at most 63 characters",
            )
        if name in seen:
            raise InvalidInputError(row.where("name"), f"{name!r} appears twice", "name pods once")
        seen.add(name)
        num_gpu = row.integer("num_gpu", low=0, high=MAX_GPUS)
        milli = row.integer("gpu_milli", low=0, high=1000, required=bool(num_gpu)) if num_gpu else 0
        if num_gpu and milli == 0:
            raise InvalidInputError(row.where("gpu_milli"), "0 is not in 1..1000", "fix it")
        if num_gpu > 1 and milli != 1000:
            raise InvalidInputError(
                row.where("gpu_milli"), "multi-GPU pods must ask for whole GPUs", "set it to 1000"
            )
        if milli % 10:
            raise InvalidInputError(
                row.where("gpu_milli"),
                f"{milli} is not a whole GPU-percent",
                "round gpu_milli to a multiple of 10",
            )
        spec = row.text("gpu_spec", required=False)
        models = [m.strip() for m in spec.split("|")] if spec else []
        if len(models) > MAX_MODELS or any(not _LABEL_VALUE.match(m) for m in models):
            raise InvalidInputError(
                row.where("gpu_spec"),
                f"{spec[:80]!r} is not a list of GPU models",
                f"write up to {MAX_MODELS} model names separated by '|', e.g. V100M16|V100M32",
            )
        pods.append(
            PodSpec(
                name=name,
                cpu_milli=row.integer("cpu_milli", low=0, high=MAX_CPU_MILLI),
                memory_mib=row.integer("memory_mib", low=0, high=MAX_MEMORY_MIB),
                num_gpu=num_gpu,
                percent=milli // 10,
                gpu_spec="|".join(models),
                qos=row.text("qos", required=False)[:32],
            )
        )
    if not pods:
        raise InvalidInputError(str(path), "has no pods", "use an openb pod list CSV")
    return pods


def pod_lists(traces: Path) -> dict[str, Path]:
    """Trace name -> pod list path, e.g. ``default`` -> openb_pod_list_default.csv."""
    prefix = "openb_pod_list_"
    found = {p.name[len(prefix) : -len(".csv")]: p for p in sorted(traces.glob(f"{prefix}*.csv"))}
    if not found:
        raise InvalidInputError(
            str(traces), "has no openb_pod_list_*.csv", "pass --traces with the openb CSV directory"
        )
    return found
