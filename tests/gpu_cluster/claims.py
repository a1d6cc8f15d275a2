"""Where a pod's GPU share went, in either mode: in DRA mode from its ResourceClaim's allocation
and the node agent's ResourceSlice devices, in device-plugin mode from the placement annotation
gpushare's extender wrote (docs/dra.md, docs/gpu-cluster.md)."""

import json
from typing import Any

from gpushare.api.dra import DRIVER
from gpushare.api.names import ANN_GPU_UUID
from tests.gpu_cluster.harness import TEST_NAMESPACE, GpuCluster, Obj


def slice_devices(gc: GpuCluster) -> dict[str, Obj]:
    """The node agent's devices, by name, from its ResourceSlices."""
    slices = gc.kjson("get", "resourceslices")["items"]
    return {
        d["name"]: d
        for s in slices
        if s["spec"].get("driver") == DRIVER
        for d in s["spec"].get("devices", [])
    }


def attribute(device: Obj, name: str) -> Any:
    value = device.get("attributes", {}).get(name, {})
    return next(iter(value.values()), None) if isinstance(value, dict) else None


def claim_of(gc: GpuCluster, pod: Obj) -> Obj:
    """The ResourceClaim the webhook gave ``pod`` (its one claim status)."""
    (status,) = pod["status"].get("resourceClaimStatuses", [])
    return gc.kjson(  # type: ignore[no-any-return]
        "get", "resourceclaim", "-n", TEST_NAMESPACE, status["resourceClaimName"],
        "--show-managed-fields",
    )  # fmt: skip


def placed(gc: GpuCluster, pod: Obj, devices: dict[str, Obj]) -> dict[str, Any]:
    """Where the pod's claim went and who allocated it: the GPU's UUID, the gpuPercent it
    consumes and the manager of the claim's status (gpushare's controller, not kube-scheduler)."""
    claim = claim_of(gc, pod)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    managers = sorted(
        {
            f["manager"]
            for f in claim["metadata"].get("managedFields", [])
            if f.get("subresource") == "status" and "allocation" in json.dumps(f.get("fieldsV1"))
        }
    )
    return {
        "gpu": attribute(devices[result["device"]], "uuid"),
        "gpuPercent": result.get("consumedCapacity", {}).get("gpuPercent"),
        "allocated_by": managers,
    }


def pod_gpu(gc: GpuCluster, pod: Obj) -> str | None:
    """The UUID of the GPU ``pod`` was given, in the cluster's mode."""
    if gc.mode == "dra":
        return placed(gc, pod, slice_devices(gc))["gpu"]  # type: ignore[no-any-return]
    return pod["metadata"].get("annotations", {}).get(ANN_GPU_UUID)  # type: ignore[no-any-return]
