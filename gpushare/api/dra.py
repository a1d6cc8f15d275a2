"""The DRA contract of gpushare: driver name, device attributes and capacities, the CDI kind,
and the opaque configuration a ResourceClaim (or its DeviceClass) may pass to the driver.

Capacity and attribute names are C identifiers because the API server accepts nothing else
there (``gpuPercent``, not ``gpu-percent``); unqualified names sit in the driver's domain, so
a CEL selector reads ``device.attributes["gpu.gpushare.io"].model`` and
``device.capacity["gpu.gpushare.io"].gpuPercent`` (docs/architecture.md, "Node agent: DRA
mode").

The opaque configuration is ``{apiVersion: gpushare.io/v1alpha1, kind: MpsConfig, class:
latency|batch, limit: <percent>}``: the class sets the MPS client priority, the limit the
most of the GPU the claim may use, at least its consumed ``gpuPercent`` (what it is
guaranteed). Both work as ``gpushare.io/class`` and ``gpushare.io/gpu-limit`` do for annotated
pods; the driver applies the same thread rule (gpushare.packing.threads). Parsing is total
and strict: unknown fields are refused, so a typo never silently runs a pod with defaults.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import CLASS_BATCH, CLASSES, GROUP, SLICES_PER_GPU, VERSION

DRIVER: Final = f"gpu.{GROUP}"
"""The DRA driver name: ResourceSlices' ``spec.driver``, results' ``driver``, the kubelet
plugin's registered name."""
CDI_KIND: Final = f"{GROUP}/gpu"
"""CDI ``vendor/class`` of the devices the plugin writes (one per prepared claim)."""
CDI_VERSION: Final = "0.6.0"

DEVICE_PREFIX: Final = "gpu-"
"""A GPU's device name in the node's pool: ``gpu-<index>``."""
CAPACITY_GPU_PERCENT: Final = "gpuPercent"
"""Consumable compute share of a GPU: 100 per GPU; what a claim consumes is what it is
guaranteed (its request); its MPS thread cap follows gpushare.packing.threads."""
CAPACITY_MEMORY: Final = "memory"
"""Consumable device memory in bytes; 0 consumed means "the share of memory in proportion to
``gpuPercent``" (the device plugin's rule for pods without a memory annotation)."""
ATTR_UUID: Final = "uuid"
ATTR_MODEL: Final = "model"
ATTR_INDEX: Final = "index"
ATTR_COMPUTE_CAPABILITY: Final = "computeCapability"
ATTR_MPS_CAPABLE: Final = "mpsCapable"
ATTR_SIMULATED: Final = "simulated"

DEVICE_CLASS: Final = f"mps.{GROUP}"
"""The DeviceClass of gpushare's shares the chart makes (``dra.deviceClass.name``)."""
POD_CLAIM: Final = "gpushare-gpu"
"""``spec.resourceClaims[].name`` of the claim the webhook gives an annotated pod in DRA
mode (gpushare.cluster.webhook.claims); a pod with it is placed by the DRA allocator."""

PLACEMENT_GATE: Final = f"{GROUP}/placement"
"""The scheduling gate of a pod whose gpushare claim the controller allocates (gpushare
placement, docs/dra.md "Who places a claim"): kube-scheduler leaves the pod alone until the
controller has allocated the claim and removed the gate."""

ANN_DRA_GPU: Final = f"{GROUP}/dra-gpu"
"""UUID of the GPU the controller allocated a GpuShare-governed pod's claim on, written with
the removal of PLACEMENT_GATE: the operator profiles that GPU when the share elects the pod
(docs/dra.md, "GpuShares and profiles"). Refused at creation, fixed afterwards like every
gpushare annotation."""

CONFIG_API_VERSION: Final = f"{GROUP}/{VERSION}"
CONFIG_KIND: Final = "MpsConfig"
_CONFIG_FIELDS: Final = ("apiVersion", "kind", "class", "limit")
_CONFIG_FIX = (
    f"write {{apiVersion: {CONFIG_API_VERSION}, kind: {CONFIG_KIND}, class: latency|batch, "
    "limit: <1..100>}, every field but apiVersion and kind optional"
)


def device_name(index: int) -> str:
    return f"{DEVICE_PREFIX}{index}"


@dataclass(frozen=True)
class MpsConfig:
    """What a claim's opaque configuration asks of the MPS client."""

    gpu_class: str = CLASS_BATCH
    """``latency`` (MPS client priority 0) or ``batch`` (1)."""
    limit: int | None = None
    """Most of the GPU the claim may use, in percent (at least ``gpuPercent``); None: the
    default of gpushare.packing.threads (a batch claim is not throttled unless a latency-class
    claim shares its GPU)."""


def parse_mps_config(parameters: Any, *, field: str) -> MpsConfig:
    """Read one opaque ``parameters`` object; InvalidInputError names ``field.<key>``."""
    if not isinstance(parameters, dict):
        raise InvalidInputError(field, "must be an object", _CONFIG_FIX)
    unknown = sorted(str(k) for k in parameters if k not in _CONFIG_FIELDS)
    if unknown:
        raise InvalidInputError(
            f"{field}.{unknown[0][:64]}",
            f"unknown field(s) {', '.join(unknown)[:200]}",
            _CONFIG_FIX,
        )
    if parameters.get("apiVersion") != CONFIG_API_VERSION:
        raise InvalidInputError(
            f"{field}.apiVersion", f"must be {CONFIG_API_VERSION!r}", _CONFIG_FIX
        )
    if parameters.get("kind") != CONFIG_KIND:
        raise InvalidInputError(f"{field}.kind", f"must be {CONFIG_KIND!r}", _CONFIG_FIX)
    gpu_class = parameters.get("class", CLASS_BATCH)
    if not isinstance(gpu_class, str) or gpu_class not in CLASSES:
        raise InvalidInputError(
            f"{field}.class", f"must be one of {', '.join(CLASSES)}", _CONFIG_FIX
        )
    limit = parameters.get("limit")
    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= SLICES_PER_GPU
    ):
        raise InvalidInputError(
            f"{field}.limit", f"must be a whole percent 1..{SLICES_PER_GPU}", _CONFIG_FIX
        )
    return MpsConfig(gpu_class=gpu_class, limit=limit)


MAX_RESULTS: Final = 32
"""Most device results (and configs) of one claim read (the API allows 32 per claim)."""


def allocation_configs(
    devices: Mapping[str, Any], *, field: str
) -> list[tuple[list[str], MpsConfig]]:
    """(requests, config) of each opaque config of our driver in ``devices["config"]`` (a
    claim's ``spec.devices`` or ``status.allocation.devices``), in order: the API lists the
    class's configs before the claim's, so later entries override earlier ones.
    InvalidInputError names ``field[i]...`` of the first bad entry."""
    fix = f"write {{apiVersion: {CONFIG_API_VERSION}, kind: {CONFIG_KIND}, ...}} per request"
    raw = devices.get("config") or []
    if not isinstance(raw, list):
        raise InvalidInputError(field, "must be a list", fix)
    out: list[tuple[list[str], MpsConfig]] = []
    for i, entry in enumerate(raw[:MAX_RESULTS]):
        opaque = entry.get("opaque") if isinstance(entry, dict) else None
        if not isinstance(opaque, dict) or opaque.get("driver") != DRIVER:
            continue
        requests = entry.get("requests") or []
        if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
            raise InvalidInputError(
                f"{field}[{i}].requests", "must be a list of request names", fix
            )
        config = parse_mps_config(opaque.get("parameters"), field=f"{field}[{i}].opaque.parameters")
        out.append((requests, config))
    return out


def config_for(request: str, configs: Sequence[tuple[list[str], MpsConfig]]) -> MpsConfig:
    """The last config naming ``request`` (or its parent request "req" of "req/sub"), or naming
    no request at all; the defaults when none does."""
    chosen = MpsConfig()
    parent = request.split("/", 1)[0]
    for requests, config in configs:
        if not requests or request in requests or parent in requests:
            chosen = config
    return chosen
