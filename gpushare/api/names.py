"""Annotation keys, label keys, resource names and other names of record (docs/architecture.md).

Keep these stable once other components use them: they are stored in the API server.
"""

from typing import Final

GROUP: Final = "gpushare.io"
VERSION: Final = "v1alpha1"

# Extended resource advertised by the device plugin: 100 slices per physical GPU.
RESOURCE_GPU_PERCENT: Final = f"{GROUP}/gpu-percent"
SLICES_PER_GPU: Final = 100
# Device IDs handed to the kubelet are "<GPU-UUID>::<NN>", NN in 00..99.
DEVICE_ID_SEPARATOR: Final = "::"
NVIDIA_GPU_RESOURCE: Final = "nvidia.com/gpu"

# User annotations on pods.
ANN_FRACTION: Final = f"{GROUP}/gpu-fraction"
ANN_MEMORY: Final = f"{GROUP}/gpu-memory"
ANN_CLASS: Final = f"{GROUP}/class"
ANN_SHARE: Final = f"{GROUP}/share"
# Optional: the most of one GPU the pod's processes may use when neighbours leave room (its MPS
# active-thread cap), like a Kubernetes CPU limit; the fraction is the request (guaranteed).
ANN_LIMIT: Final = f"{GROUP}/gpu-limit"
# Which container gets the GPU when a pod has several (default: the first).
ANN_CONTAINER: Final = f"{GROUP}/container"
# Opt-in to opportunistic placement, "true" or "false" (default: its GpuShare's
# spec.opportunistic, else the cluster's default): where no GPU has the pod's request free, it
# may run beyond a GPU's guaranteed capacity, preemptible (docs/packing.md, "The sharing
# contract").
ANN_OPPORTUNISTIC: Final = f"{GROUP}/opportunistic"
# Extended resource an opted-in pod asks the kubelet for instead of gpu-percent, in the same
# GPU-percent: whether it runs guaranteed or beyond a GPU's guaranteed capacity is gpushare's
# accounting (placement annotations), so the kubelet must admit it beside full guaranteed
# shares. Each GPU advertises more of it than it has (OPPORTUNISTIC_SLICES_PER_GPU, device IDs
# "<GPU-UUID>::o<NNN>"); the scheduler extender, not the kubelet, keeps a GPU within its
# guaranteed capacity.
RESOURCE_GPU_OPPORTUNISTIC: Final = f"{GROUP}/opportunistic-gpu-percent"
OPPORTUNISTIC_SLICES_PER_GPU: Final = 300
# The PriorityClass the webhook gives opted-in pods that name none (the chart creates it as
# <release>-opportunistic): kube-scheduler's queue tries higher priorities first, so a
# guaranteed pod waiting beside an opportunistic one is placed first instead of preempting it
# right after (docs/packing.md, "The sharing contract"). Its value in the chart; below the
# default 0, preemptionPolicy Never.
OPPORTUNISTIC_PRIORITY: Final = -10
GPU_RESOURCES: Final = (RESOURCE_GPU_PERCENT, RESOURCE_GPU_OPPORTUNISTIC)

# Placement annotations written by the extender at bind.
ANN_GPU_UUID: Final = f"{GROUP}/gpu-uuid"
ANN_THREAD_PERCENT: Final = f"{GROUP}/active-thread-percentage"
# The guaranteed share (GPU-percent per GPU) the placement accounted for; the thread cap above is
# the effective limit, which may be larger (docs/packing.md, "Requests and limits").
ANN_REQUEST_PERCENT: Final = f"{GROUP}/request-percentage"
ANN_MEMORY_LIMIT: Final = f"{GROUP}/memory-limit"
ANN_BIND_TIME: Final = f"{GROUP}/bind-time"
ANN_STATE: Final = f"{GROUP}/state"
STATE_ASSUMED: Final = "assumed"
STATE_ALLOCATED: Final = "allocated"
# Written for opted-in pods: "opportunistic" (beyond the GPU's guaranteed capacity, holding no
# guaranteed share) until the controller promotes it to "guaranteed" once its request fits.
ANN_TIER: Final = f"{GROUP}/tier"
TIER_GUARANTEED: Final = "guaranteed"
TIER_OPPORTUNISTIC: Final = "opportunistic"
TIERS: Final = (TIER_GUARANTEED, TIER_OPPORTUNISTIC)

# Node inventory and labels published by the node agent.
ANN_NODE_GPUS: Final = f"{GROUP}/gpus"
# "true" once the kubelet has the node agent's healthy devices; "false" while it registers or
# re-registers (kubelet or agent restart): a pod bound then would fail the kubelet's admission.
ANN_AGENT_READY: Final = f"{GROUP}/agent-ready"
# How the node agent serves its GPUs: "deviceplugin" (annotated pods, placed by the extender)
# or "dra" (ResourceClaims, placed by the claim allocator). The extender places nothing on a
# "dra" node (docs/dra.md, "Both modes in one cluster").
ANN_AGENT_MODE: Final = f"{GROUP}/agent-mode"
AGENT_MODE_DRA: Final = "dra"
LABEL_MPS_CAPABLE: Final = f"{GROUP}/mps-capable"
LABEL_SIMULATED: Final = f"{GROUP}/simulated"
# Node label an administrator sets: which of the node's GPUs gpushare manages ("all", "none",
# or indexes joined by "_", e.g. "0_1"); overrides the agent's --gpus (docs/coexistence.md).
LABEL_MANAGED_GPUS: Final = f"{GROUP}/managed-gpus"

SCHEDULER_NAME: Final = "gpushare-scheduler"

CLASS_LATENCY: Final = "latency"
CLASS_BATCH: Final = "batch"
CLASSES: Final = (CLASS_LATENCY, CLASS_BATCH)

# MPS client priority by class: 0 normal (latency), 1 below normal (batch).
MPS_PRIORITY_BY_CLASS: Final = {CLASS_LATENCY: 0, CLASS_BATCH: 1}

# One MPS server accepts at most 48 client processes (H200, driver 580).
MPS_MAX_CLIENTS: Final = 48

# Environment variables gpushare owns inside containers; pods may not set them.
RESERVED_ENV_PREFIXES: Final = ("CUDA_MPS_",)
RESERVED_ENV_NAMES: Final = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")

METRIC_PREFIX: Final = "gpushare_"

# The node agent's metrics port (/metrics, /healthz, /profile), also published as a host port
# for the operator's profiler client. Not 9400: that is NVIDIA dcgm-exporter's, with a host
# port too, and gpushare runs beside it (docs/coexistence.md).
AGENT_METRICS_PORT: Final = 9445

# Fault containment: a workload whose MPS clients fault repeatedly gets a GPU of its own.
# Node annotation (JSON, written by the node agent): the workloads it marked exclusive.
ANN_NODE_EXCLUSIVE: Final = f"{GROUP}/exclusive-workloads"
# Pod annotation: why the pod was given a whole GPU (written by the webhook or the node agent).
ANN_EXCLUSIVE: Final = f"{GROUP}/exclusive"
# Node annotation (JSON, node agent): workloads moved apart from the workloads they kept
# faulting with, and the GPU where they faulted (same format as ANN_NODE_EXCLUSIVE).
ANN_NODE_SEPARATED: Final = f"{GROUP}/separated-workloads"
# Pod annotation: comma-separated GPU UUIDs the pod must not be placed on (the webhook sets it
# for a separated workload's new pods; a user may set it too).
ANN_AVOID_GPUS: Final = f"{GROUP}/avoid-gpus"
# Pod annotation (node agent): why the controller should evict the pod (it keeps breaking its
# GPU's other tenants). The controller holds the eviction right; the node agent does not.
ANN_EVICT: Final = f"{GROUP}/evict"
# Pod annotation (controller): when capacity the scheduler cannot see was let go after the
# extender refused this pod; the update itself is what sends the pod back to kube-scheduler's
# queue (see gpushare.cluster.extender.requeue).
ANN_REQUEUED_AT: Final = f"{GROUP}/requeued-at"

# Tenancy (docs/security.md). Namespace labels only cluster admins can set:
# pods of namespaces with the same sharing group may share a GPU (default: one namespace).
LABEL_SHARING_GROUP: Final = f"{GROUP}/sharing-group"
# Pods of a namespace labelled so may keep others off their GPU (packing-policy exclusive,
# profiling alone).
LABEL_NEIGHBOUR_RULES: Final = f"{GROUP}/neighbour-rules"
NEIGHBOUR_RULES_GRANTED: Final = "granted"
# A GpuShare's spec.selector links new pods of a namespace labelled so (an admin's consent: a
# pod's label alone is not its owner's); elsewhere pods join a share by gpushare.io/share.
LABEL_SHARE_SELECTORS: Final = f"{GROUP}/share-selectors"
SHARE_SELECTORS_ENABLED: Final = "enabled"

# Pausing opportunistic pods (docs/packing.md, "The sharing contract"; gpushare.api.pause).
# Pod annotation (controller, JSON PauseRequest): the pod's containers are to be frozen, and why.
# Absent: the pod runs. Only the controller writes it; the node agent carries it out.
ANN_PAUSE: Final = f"{GROUP}/pause"
# Pod annotation (node agent, JSON PauseState): the freeze in effect on the node, since when,
# for which request; absent while the pod runs.
ANN_PAUSED: Final = f"{GROUP}/paused"
