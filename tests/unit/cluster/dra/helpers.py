"""Slices, claims and pods as the API server sends them to the controller in DRA mode."""

from collections.abc import Mapping, Sequence
from typing import Any

from gpushare.api.dra import CONFIG_API_VERSION, CONFIG_KIND, DEVICE_CLASS, DRIVER, PLACEMENT_GATE
from gpushare.api.inventory import GpuInfo
from gpushare.cluster.dra import placement, search
from gpushare.cluster.dra.devices import DraDevices
from gpushare.cluster.dra.placement import ClaimAsk
from gpushare.cluster.dra.search import Choice
from gpushare.node.dra.slices import build_slice
from gpushare.packing.placer import Placer

GIB = 2**30
Obj = dict[str, Any]


def gpu_info(index: int, *, uuid: str | None = None, memory_gib: int = 80) -> GpuInfo:
    return GpuInfo(
        uuid=uuid or f"GPU-{index}",
        index=index,
        model="NVIDIA H100 80GB HBM3",
        memory_bytes=memory_gib * GIB,
        sm_count=132,
        compute_capability="9.0",
        mps_ready=True,
    )


def node_slice(node: str, gpus: int = 1, *, memory_gib: int = 80) -> Obj:
    """The node agent's ResourceSlice for ``gpus`` GPUs named ``<node>-GPU-<index>``."""
    return build_slice(
        node_name=node,
        gpus=[gpu_info(i, uuid=f"{node}-GPU-{i}", memory_gib=memory_gib) for i in range(gpus)],
        generation=1,
    )


def ledger(*slices: Obj, claims: Sequence[Obj] = ()) -> DraDevices:
    """A synced DraDevices holding ``slices`` and ``claims``."""
    devices = DraDevices()
    devices.replace_slices(slices)
    devices.replace_claims(claims)
    return devices


def mps_config(**fields: Any) -> Obj:
    return {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, **fields}


def opaque(parameters: Mapping[str, Any], *, requests: Sequence[str] = ()) -> Obj:
    """A ``config`` entry of a claim's ``spec.devices`` for our driver."""
    entry: Obj = {"opaque": {"driver": DRIVER, "parameters": dict(parameters)}}
    if requests:
        entry["requests"] = list(requests)
    return entry


def share_claim(
    name: str,
    *,
    namespace: str = "ns",
    percent: str | None = "30",
    memory: str | None = None,
    config: Mapping[str, Any] | None = None,
    count: int | None = None,
    device_class: str = DEVICE_CLASS,
    resource_version: str = "1",
    **exactly: Any,
) -> Obj:
    """An unallocated ResourceClaim with one request ``gpu`` of ``device_class``
    (``exactly``: more fields of the request, e.g. selectors)."""
    requests: Obj = {}
    if percent is not None:
        requests["gpuPercent"] = percent
    if memory is not None:
        requests["memory"] = memory
    body: Obj = {"deviceClassName": device_class, **exactly}
    if requests:
        body["capacity"] = {"requests": requests}
    if count is not None:
        body["count"] = count
    devices: Obj = {"requests": [{"name": "gpu", "exactly": body}]}
    if config is not None:
        devices["config"] = [opaque(config)]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "resourceVersion": resource_version,
        },
        "spec": {"devices": devices},
    }


def allocated_claim(
    name: str,
    *,
    namespace: str = "ns",
    pool: str = "n1",
    device: str = "gpu-0",
    consumed: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    driver: str = DRIVER,
) -> Obj:
    """A claim kube-scheduler allocated on ``pool``/``device``."""
    result: Obj = {"request": "gpu", "driver": driver, "pool": pool, "device": device}
    if consumed is not None:
        result["consumedCapacity"] = dict(consumed)
    allocation: Obj = {"devices": {"results": [result]}}
    if config is not None:
        allocation["devices"]["config"] = [{"source": "FromClaim", **opaque(config)}]
    claim = share_claim(name, namespace=namespace)
    claim["status"] = {"allocation": allocation}
    return claim


def gated_pod(
    name: str,
    *,
    namespace: str = "ns",
    claim: str | None = None,
    template: str | None = None,
    made: str | None = None,
    cpu: str | None = None,
    gates: Sequence[str] = (PLACEMENT_GATE,),
    annotations: Mapping[str, str] | None = None,
) -> Obj:
    """A pod held by ``gates`` using ResourceClaim ``claim``, or a claim from ResourceClaimTemplate
    ``template`` that kube-controller-manager named ``made`` (None: not made yet)."""
    entry: Obj = {"name": "gpu"}
    if claim is not None:
        entry["resourceClaimName"] = claim
    if template is not None:
        entry["resourceClaimTemplateName"] = template
    container: Obj = {
        "name": "main",
        "image": "busybox",
        "resources": {"claims": [{"name": "gpu"}]},
    }
    if cpu is not None:
        container["resources"]["requests"] = {"cpu": cpu}
    pod: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {
            "schedulingGates": [{"name": g} for g in gates],
            "resourceClaims": [entry],
            "containers": [container],
        },
        "status": {"phase": "Pending"},
    }
    if annotations:
        pod["metadata"]["annotations"] = dict(annotations)
    if made is not None:
        pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": made}]
    return pod


# ---- placement ------------------------------------------------------------------------------


def ask_of(claim: Obj) -> ClaimAsk:
    ask = placement.read_ask(claim, device_class=DEVICE_CLASS)
    assert isinstance(ask, ClaimAsk), ask
    return ask


def by_namespace(namespace: str) -> str:
    return namespace


no_host_limit: dict[str, tuple[int, int]] = {}
"""No node's status says what it offers."""


def choose(
    devices: DraDevices,
    claim: Obj,
    *,
    cpu_milli: int = 0,
    host_free: Mapping[str, tuple[int, int]] = no_host_limit,
) -> Choice | dict[str, int]:
    namespace = claim["metadata"]["namespace"]
    want = placement.demand(
        ask_of(claim), cpu_milli=cpu_milli, memory_bytes=0, tenancy=by_namespace(namespace)
    )
    return search.choose(Placer(), devices, want, tenancy_of=by_namespace, host_free=host_free)


def chosen(
    devices: DraDevices,
    claim: Obj,
    *,
    cpu_milli: int = 0,
    host_free: Mapping[str, tuple[int, int]] = no_host_limit,
) -> tuple[str, str]:
    """(pool, device) the claim is placed on."""
    choice = choose(devices, claim, cpu_milli=cpu_milli, host_free=host_free)
    assert isinstance(choice, Choice), choice
    (gpu,) = choice.gpus
    return gpu.pool, gpu.device
