"""What the openb replay creates: KWOK nodes from a node list, pods from a pod list.

Pure functions (manifests are plain dicts), so the unit tests check exactly what is sent to the
API server. Pods are written the way a user writes them for an installed gpushare:

- a pod using GPUs asks with ``gpushare.io/gpu-fraction`` (``"0.46"``, or ``"2"`` for two
  whole GPUs) and its CPU and memory requests; the admission webhook adds the
  ``gpushare.io/gpu-percent`` request and sends it to gpushare-scheduler;
- a pod limited to some GPU models says so by required node affinity on the
  ``nvidia.com/gpu.product`` node label (the label NVIDIA's GPU Feature Discovery puts on real
  nodes; the replay's nodes carry it);
- a pod without GPUs names ``schedulerName: gpushare-scheduler``, so that the extender places
  it where its CPU and memory strand the least GPU share (docs/scheduling.md); the stock
  default-scheduler would spread it instead (docs/packing.md measures what that costs).

The stock phase sends the same pods to the default-scheduler, GPUs asked as a plain extended
resource (``gpushare.io/gpu-percent``, node totals only), to measure the stock rate.
"""

from typing import Any

from bench.scale.workload import FAKE_IMAGE, KWOK_NODE_ANNOTATION, gpu_uuid
from bench.scale.workload import fraction_text as share_text
from bench.sim.trace import NodeSpec, PodSpec, gpu_memory_bytes
from gpushare.api.inventory import GpuInfo, dump_inventory
from gpushare.api.names import (
    ANN_FRACTION,
    ANN_NODE_GPUS,
    LABEL_MPS_CAPABLE,
    LABEL_SIMULATED,
    RESOURCE_GPU_PERCENT,
    SCHEDULER_NAME,
    SLICES_PER_GPU,
)

REPLAY_LABEL = "gpushare.io/openb-replay"
"""On every object the replay creates; its value says which (``nodes``, or a run's pods). The
replay deletes only objects carrying it."""
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
NODE_PODS = 1000
"""Pods per node: the trace states no limit, and kube-scheduler's default 110 must not bind."""
NODES_VALUE = "nodes"


def node_manifest(spec: NodeSpec) -> dict[str, Any]:
    """A KWOK node shaped like the node list's row, publishing what a gpushare node agent
    would: capacity with ``gpushare.io/gpu-percent`` and the GPU inventory annotation."""
    inventory = [
        GpuInfo(
            uuid=gpu_uuid(spec.name, i),
            index=i,
            model=spec.model,
            memory_bytes=gpu_memory_bytes(spec.model),
            sm_count=80,
            compute_capability="8.0",
            healthy=True,
            mps_ready=True,
            simulated=True,
        )
        for i in range(spec.gpus)
    ]
    resources = {
        "cpu": f"{spec.cpu_milli}m",
        "memory": f"{spec.memory_mib}Mi",
        "pods": str(NODE_PODS),
        RESOURCE_GPU_PERCENT: str(spec.gpus * SLICES_PER_GPU),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": {
                "kubernetes.io/hostname": spec.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                GPU_PRODUCT_LABEL: spec.model,
                LABEL_MPS_CAPABLE: "true",
                LABEL_SIMULATED: "true",
                REPLAY_LABEL: NODES_VALUE,
            },
            "annotations": {
                KWOK_NODE_ANNOTATION[0]: KWOK_NODE_ANNOTATION[1],
                ANN_NODE_GPUS: dump_inventory(inventory),
            },
        },
        "spec": {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def fraction_text(pod: PodSpec) -> str:
    """How a user writes the pod's GPUs: 46 % -> "0.46", a whole GPU -> "1", two -> "2"."""
    return str(pod.num_gpu) if pod.percent >= SLICES_PER_GPU else share_text(pod.percent)


def pod_manifest(
    pod: PodSpec, *, name: str, namespace: str, run: str, stock: bool = False
) -> dict[str, Any]:
    """The pod of one arrival. ``stock``: for the default-scheduler, GPUs as a node-level
    extended resource (no per-GPU placement)."""
    requests: dict[str, str] = {}
    if pod.cpu_milli:
        requests["cpu"] = f"{pod.cpu_milli}m"
    if pod.memory_mib:
        requests["memory"] = f"{pod.memory_mib}Mi"
    container: dict[str, Any] = {"name": "job", "image": FAKE_IMAGE, "resources": {}}
    annotations: dict[str, str] = {}
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 0,
        "containers": [container],
    }
    if pod.num_gpu and stock:
        total = str(pod.gpu_percent_total)
        requests[RESOURCE_GPU_PERCENT] = total
        container["resources"]["limits"] = {RESOURCE_GPU_PERCENT: total}
    elif pod.num_gpu:
        annotations[ANN_FRACTION] = fraction_text(pod)
    elif not stock:
        spec["schedulerName"] = SCHEDULER_NAME
    if requests:
        container["resources"]["requests"] = requests
    if pod.num_gpu and pod.models:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": GPU_PRODUCT_LABEL,
                                    "operator": "In",
                                    "values": list(pod.models),
                                }
                            ]
                        }
                    ]
                }
            }
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {REPLAY_LABEL: run},
            "annotations": annotations,
        },
        "spec": spec,
    }
