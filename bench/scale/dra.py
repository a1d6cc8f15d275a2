"""The scale bench's DRA phases: the same openb pods asked for as ResourceClaims, on the same
KWOK nodes, allocated from ResourceSlices either by the controller with gpushare's placer
(``dra-gpushare``: what the chart's ``mode: dra`` does, pods gated by ``gpushare.io/placement``
as the webhook gates them, docs/dra.md "Who places a claim") or by the stock kube-scheduler's
DRA allocator (``dra``: ``dra.placement: kube-scheduler``, first fit).

Everything a claim and a slice contain comes from the product: each node's slice is what the
node agent publishes in ``--mode dra`` (``gpushare.node.dra.slices.build_slice``), each pod's
claim is what the webhook's template for its annotations asks
(``gpushare.cluster.webhook.claims.claim_template``), and the DeviceClass is the chart's
selector. No kube-controller-manager runs here, so each claim is created beside its pod from
that template (as the resourceclaim controller would), before the phase's clock starts.
"""

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from bench.scale.workload import BENCH_LABEL, NodeShape, TracePod, _pod, node_inventory
from gpushare.api.dra import DEVICE_CLASS, DRIVER, PLACEMENT_GATE, POD_CLAIM
from gpushare.api.names import SLICES_PER_GPU
from gpushare.api.request import GpuRequest
from gpushare.cluster.webhook.claims import claim_template
from gpushare.node.dra.slices import build_slice

PHASE = "dra"
"""Claims allocated by kube-scheduler (first fit)."""
GPUSHARE_PHASE = "dra-gpushare"
"""Claims allocated by the controller with gpushare's placer."""
FEATURE_GATES = "DRAConsumableCapacity=true"
CONTROLLER_ARGS = ("--annotation-mode=dra",)
"""What the chart passes the controller in ``mode: dra`` (``dra.placement`` gpushare, the
default): it then places the claims of gated pods."""


def device_class() -> dict[str, Any]:
    """The chart's DeviceClass (helm/gpushare/templates/device-class.yaml)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def node_slice(name: str, shape: NodeShape) -> dict[str, Any]:
    """The ResourceSlice the node agent in dra mode publishes for node ``name``."""
    return build_slice(node_name=name, gpus=node_inventory(name, shape), generation=1)


def claim(index: int, task: TracePod, *, namespace: str, phase: str = PHASE) -> dict[str, Any]:
    """The claim kube-controller-manager would make from the webhook's template for the pod's
    annotations (its share and class)."""
    request = GpuRequest(percent=task.percent, memory_bytes=None, gpu_class=task.gpu_class)
    template = claim_template(request, namespace=namespace, device_class=DEVICE_CLASS)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"{phase}-{index:05d}-gpu",
            "namespace": namespace,
            "labels": {BENCH_LABEL: phase},
        },
        "spec": template["spec"]["spec"],
    }


def pod(index: int, task: TracePod, *, namespace: str, phase: str = PHASE) -> dict[str, Any]:
    """The pod as the webhook leaves it in DRA mode: its claim instead of the gpu-percent
    resource, the default scheduler, and in the ``dra-gpushare`` phase the scheduling gate the
    controller removes once it has allocated the claim."""
    out = _pod(
        f"{phase}-{index:05d}", namespace, phase, task, scheduler="default-scheduler", percent=0
    )
    (container,) = out["spec"]["containers"]
    resources = container["resources"]
    resources["requests"] = {
        k: v for k, v in resources["requests"].items() if not k.startswith("gpushare.io/")
    }
    resources.pop("limits", None)
    resources["claims"] = [{"name": POD_CLAIM}]
    out["spec"]["resourceClaims"] = [
        {"name": POD_CLAIM, "resourceClaimName": f"{phase}-{index:05d}-gpu"}
    ]
    if phase == GPUSHARE_PHASE:
        out["spec"]["schedulingGates"] = [{"name": PLACEMENT_GATE}]
    return out


def check(claims: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What the allocator handed out: claims allocated, and GPUs whose consumed ``gpuPercent``
    adds up to more than 100 (must be none)."""
    used: dict[tuple[str, str], int] = defaultdict(int)
    allocated = 0
    for c in claims:
        results = (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        ) or []
        if results:
            allocated += 1
        for r in results:
            consumed = (r.get("consumedCapacity") or {}).get("gpuPercent", str(SLICES_PER_GPU))
            used[(str(r.get("pool")), str(r.get("device")))] += int(consumed)
    over = sorted(f"{pool}/{dev}: {pct}%" for (pool, dev), pct in used.items() if pct > 100)
    return {
        "claims_allocated": allocated,
        "gpus_used": len(used),
        "violations": len(over),
        "violation_examples": over[:20],
        "gpu_percent_allocated": sum(used.values()),
    }
