"""Read the openb trace CSVs (Alibaba cluster-trace-gpu-v2023) in place.

Node list: ``sn, cpu_milli, memory_mib, gpu, model``. Pod lists: ``name, cpu_milli,
memory_mib, num_gpu, gpu_milli`` plus optional ``gpu_spec`` (allowed models, ``|``-separated)
and ``qos``. ``gpu_milli`` is the share of one GPU in thousandths for single-GPU pods; the
simulator works in GPU-percent, so it must be a multiple of 10 (it is, in every openb list).
"""

import csv
from dataclasses import dataclass
from pathlib import Path

from gpushare.api.errors import InvalidInputError

GPU_MEMORY_GIB = {"T4": 16, "P100": 16, "V100M16": 16, "V100M32": 32, "A10": 24}
"""Per-GPU memory by model (G1-G3 are undisclosed; taken as 32 GiB). Only used for the
proportional GPU-memory share, which never binds in these traces."""


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


def _int(row: dict[str, str], key: str, where: str, *, low: int = 0) -> int:
    raw = (row.get(key) or "").strip()
    try:
        value = int(float(raw))
    except ValueError:
        raise InvalidInputError(
            f"{where}.{key}", f"{raw!r} is not a number", "fix the CSV row"
        ) from None
    if value < low:
        raise InvalidInputError(f"{where}.{key}", f"{value} is below {low}", "fix the CSV row")
    return value


def _rows(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    if not path.is_file():
        raise InvalidInputError(
            str(path), "does not exist", "pass --traces pointing at the openb CSV directory"
        )
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [k for k in required if k not in (reader.fieldnames or [])]
        if missing:
            raise InvalidInputError(
                str(path), f"lacks columns {missing}", "use an openb node/pod list CSV"
            )
        return list(reader)


def load_nodes(path: Path) -> list[NodeSpec]:
    """GPU nodes of a node list (CPU-only rows are skipped: the experiment uses GPU nodes)."""
    nodes: list[NodeSpec] = []
    for i, row in enumerate(_rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model"))):
        where = f"{path.name}[{i}]"
        gpus = _int(row, "gpu", where)
        if gpus == 0:
            continue
        nodes.append(
            NodeSpec(
                name=row["sn"],
                cpu_milli=_int(row, "cpu_milli", where),
                memory_mib=_int(row, "memory_mib", where),
                gpus=gpus,
                model=(row.get("model") or "").strip(),
            )
        )
    if not nodes:
        raise InvalidInputError(str(path), "has no GPU nodes", "use openb_node_list_gpu_node.csv")
    return nodes


def load_pods(path: Path) -> list[PodSpec]:
    pods: list[PodSpec] = []
    for i, row in enumerate(_rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu"))):
        where = f"{path.name}[{i}]"
        num_gpu = _int(row, "num_gpu", where)
        milli = _int(row, "gpu_milli", where) if num_gpu else 0
        if num_gpu and not 0 < milli <= 1000:
            raise InvalidInputError(f"{where}.gpu_milli", f"{milli} is not in 1..1000", "fix it")
        if num_gpu > 1 and milli != 1000:
            raise InvalidInputError(
                f"{where}.gpu_milli", "multi-GPU pods must ask for whole GPUs", "set it to 1000"
            )
        if milli % 10:
            raise InvalidInputError(
                f"{where}.gpu_milli",
                f"{milli} is not a whole GPU-percent",
                "round gpu_milli to a multiple of 10",
            )
        pods.append(
            PodSpec(
                name=row["name"],
                cpu_milli=_int(row, "cpu_milli", where),
                memory_mib=_int(row, "memory_mib", where),
                num_gpu=num_gpu,
                percent=milli // 10,
                gpu_spec=(row.get("gpu_spec") or "").strip(),
                qos=(row.get("qos") or "").strip(),
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
