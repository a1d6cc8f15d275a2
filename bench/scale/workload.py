"""What the scale bench submits: fake GPU nodes and pods shaped like the openb trace.

Everything here is pure (no I/O besides reading the trace CSV): manifests are plain dicts, so
the unit tests check exactly what the bench sends to the API server.
"""

import csv
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo, dump_inventory
from gpushare.api.names import (
    ANN_CLASS,
    ANN_FRACTION,
    ANN_NODE_GPUS,
    CLASS_BATCH,
    CLASS_LATENCY,
    LABEL_MPS_CAPABLE,
    LABEL_SIMULATED,
    RESOURCE_GPU_PERCENT,
    SCHEDULER_NAME,
    SLICES_PER_GPU,
)

DEFAULT_TRACE_FILE = "openb_pod_list_default.csv"
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
"""kwok manages only nodes with this annotation (see hack/kwok-cluster.sh)."""
BENCH_LABEL = "gpushare.io/scale-bench"
"""Label on every object the bench creates; its value is the phase (``nodes``, ``stock``,
``extender``)."""
FAKE_IMAGE = "gpushare.local/kwok-fake:never-pulled"
"""Pods never run: kwok only flips their status. The image is never pulled."""

_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "qos", "creation_time")
_FIX = "point --traces at the openb trace directory (../shared/traces/openb)"


@dataclass(frozen=True)
class NodeShape:
    """A fake GPU node; the default is the openb trace's 8-GPU node (G2: 96 CPUs, 384 GiB)."""

    gpus: int = 8
    cpu_milli: int = 96_000
    memory_mib: int = 393_216
    max_pods: int = 110
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    gpu_memory_bytes: int = 80 * 2**30
    gpu_sm_count: int = 132
    gpu_compute_capability: str = "9.0"


@dataclass(frozen=True)
class TracePod:
    """One openb task that asks for one GPU (a fraction of it, or all of it)."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_milli: int
    """Thousandths of one GPU: 470 = 47%, 1000 = the whole GPU."""
    qos: str
    creation_time: int

    @property
    def percent(self) -> int:
        """GPU-percent slices, at least 1 (the trace has shares down to 5%)."""
        return max(1, round(self.gpu_milli * SLICES_PER_GPU / 1000))

    @property
    def gpu_class(self) -> str:
        """openb's latency-sensitive tasks (``LS``) are gpushare's latency class."""
        return CLASS_LATENCY if self.qos == "LS" else CLASS_BATCH


def read_trace(traces: Path, *, file: str = DEFAULT_TRACE_FILE) -> list[TracePod]:
    """The trace's single-GPU tasks in creation order. Raises InvalidInputError naming the file
    or column when the trace is missing or malformed."""
    path = traces / file
    if not traces.is_dir():
        raise InvalidInputError("--traces", f"{str(traces)!r} is not a directory", _FIX)
    if not path.is_file():
        raise InvalidInputError(
            "--trace-file",
            f"{file!r} not found in {str(traces)!r}",
            f"{_FIX}, or name a file there",
        )
    pods: list[TracePod] = []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in _COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise InvalidInputError(
                f"{file} header", f"lacks column(s) {', '.join(missing)}", "use an openb pod list"
            )
        for line, row in enumerate(reader, start=2):
            try:
                num_gpu = int(row["num_gpu"])
                gpu_milli = int(row["gpu_milli"])
                if num_gpu != 1 or not 0 < gpu_milli <= 1000:
                    continue
                pods.append(
                    TracePod(
                        name=row["name"],
                        cpu_milli=int(row["cpu_milli"]),
                        memory_mib=int(row["memory_mib"]),
                        gpu_milli=gpu_milli,
                        qos=row["qos"],
                        creation_time=int(row["creation_time"]),
                    )
                )
            except (TypeError, ValueError) as exc:
                raise InvalidInputError(
                    f"{file} line {line}", f"bad number ({exc})", "use an unmodified openb pod list"
                ) from None
    pods.sort(key=lambda p: (p.creation_time, p.name))
    return pods


def take(pods: list[TracePod], count: int, *, fractional: bool) -> list[TracePod]:
    """``count`` tasks in trace order, cycling through the trace when it has fewer: fractional
    ones (share < 1 GPU) or whole-GPU ones."""
    chosen = [p for p in pods if (p.gpu_milli < 1000) == fractional]
    if not chosen:
        kind = "fractional" if fractional else "whole-GPU"
        raise InvalidInputError("--trace-file", f"has no {kind} single-GPU tasks", _FIX)
    return [chosen[i % len(chosen)] for i in range(count)]


def gpu_uuid(node: str, index: int) -> str:
    """A stable, realistic-looking GPU UUID for a fake GPU."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'gpushare-scale/{node}/{index}')}"


def node_name(index: int) -> str:
    return f"kwok-gpu-{index:04d}"


def node_inventory(name: str, shape: NodeShape) -> list[GpuInfo]:
    return [
        GpuInfo(
            uuid=gpu_uuid(name, i),
            index=i,
            model=shape.gpu_model,
            memory_bytes=shape.gpu_memory_bytes,
            sm_count=shape.gpu_sm_count,
            compute_capability=shape.gpu_compute_capability,
            healthy=True,
            mps_ready=True,
            simulated=True,
        )
        for i in range(shape.gpus)
    ]


def node_manifest(index: int, shape: NodeShape) -> dict[str, Any]:
    """A Node kwok will manage, with the status a gpushare node agent would publish: capacity
    incl. ``gpushare.io/gpu-percent`` and the GPU inventory annotation. Labelled simulated."""
    name = node_name(index)
    resources = {
        "cpu": f"{shape.cpu_milli}m",
        "memory": f"{shape.memory_mib}Mi",
        "pods": str(shape.max_pods),
        RESOURCE_GPU_PERCENT: str(shape.gpus * SLICES_PER_GPU),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                LABEL_MPS_CAPABLE: "true",
                LABEL_SIMULATED: "true",
                BENCH_LABEL: "nodes",
            },
            "annotations": {
                KWOK_NODE_ANNOTATION[0]: KWOK_NODE_ANNOTATION[1],
                ANN_NODE_GPUS: dump_inventory(node_inventory(name, shape)),
            },
        },
        "spec": {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def fraction_text(percent: int) -> str:
    """How a user writes the share: 47 -> "0.47", 5 -> "0.05"."""
    return f"{percent / SLICES_PER_GPU:.2f}".rstrip("0").rstrip(".") if percent < 100 else "1"


def _pod(
    name: str, namespace: str, phase: str, task: TracePod, *, scheduler: str, percent: int
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {BENCH_LABEL: phase, "gpushare.io/scale-trace-task": task.name},
            "annotations": {},
        },
        "spec": {
            "schedulerName": scheduler,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "job",
                    "image": FAKE_IMAGE,
                    "resources": {
                        "requests": {
                            "cpu": f"{task.cpu_milli}m",
                            "memory": f"{task.memory_mib}Mi",
                            RESOURCE_GPU_PERCENT: str(percent),
                        },
                        "limits": {RESOURCE_GPU_PERCENT: str(percent)},
                    },
                }
            ],
        },
    }


def fractional_pod(
    index: int, task: TracePod, *, namespace: str, phase: str = "extender"
) -> dict[str, Any]:
    """A gpushare pod as it leaves the admission webhook: the user's annotations plus the
    ``gpushare.io/gpu-percent`` request/limit and schedulerName the webhook adds."""
    pod = _pod(
        f"{phase}-{index:05d}",
        namespace,
        phase,
        task,
        scheduler=SCHEDULER_NAME,
        percent=task.percent,
    )
    pod["metadata"]["annotations"] = {
        ANN_FRACTION: fraction_text(task.percent),
        ANN_CLASS: task.gpu_class,
    }
    return pod


def whole_gpu_pod(
    index: int, task: TracePod, *, namespace: str, phase: str = "stock"
) -> dict[str, Any]:
    """The reference: a whole-GPU pod (``nvidia.com/gpu: 1`` style, here
    ``gpushare.io/gpu-percent: 100``) for the stock default-scheduler, no extender."""
    return _pod(
        f"{phase}-{index:05d}",
        namespace,
        phase,
        task,
        scheduler="default-scheduler",
        percent=SLICES_PER_GPU,
    )
