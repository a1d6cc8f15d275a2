"""Claims, a claim source and a slice store standing where the API server would."""

import copy
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from gpushare.api.dra import CONFIG_API_VERSION, CONFIG_KIND, DRIVER
from gpushare.api.pod import PodInfo
from gpushare.node.dra.cdi import CdiDir
from gpushare.node.dra.checkpoint import CHECKPOINT_FILE, Checkpoint
from gpushare.node.dra.driver import DraDriver
from gpushare.node.gpu.simulated import SimulatedBackend
from gpushare.node.mps.manager import MpsManager

NODE = "unit"
GIB = 2**30


def backend() -> SimulatedBackend:
    return SimulatedBackend("2xH100-80GB", node_name=NODE)


def mps_config(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, **fields}


def claim(
    *,
    uid: str = "0b1c2d3e-0000-4000-8000-000000000001",
    name: str = "c1",
    namespace: str = "ns",
    devices: tuple[str, ...] = ("gpu-0",),
    consumed: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    config_requests: list[str] | None = None,
    driver: str = DRIVER,
    pool: str = NODE,
    pod: str | None = "p1",
) -> dict[str, Any]:
    """An allocated ResourceClaim as the API server returns it (resource.k8s.io/v1)."""
    results = []
    for device in devices:
        result: dict[str, Any] = {
            "request": "gpu",
            "driver": driver,
            "pool": pool,
            "device": device,
        }
        if consumed is not None:
            result["consumedCapacity"] = dict(consumed)
        results.append(result)
    allocation: dict[str, Any] = {"devices": {"results": results}}
    if config is not None:
        allocation["devices"]["config"] = [
            {
                "source": "FromClaim",
                "requests": config_requests or [],
                "opaque": {"driver": DRIVER, "parameters": dict(config)},
            }
        ]
    status: dict[str, Any] = {"allocation": allocation}
    if pod is not None:
        status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": "pod-uid-1"}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "status": status,
    }


class FakeClaims:
    """A ClaimSource over a dict; counts reads. ``namespaces``: labels by namespace name."""

    def __init__(self, *claims: Mapping[str, Any]) -> None:
        self.claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}
        self.reads = 0
        self.namespaces: dict[str, dict[str, str]] = {}

    def namespace_labels(self, name: str) -> Mapping[str, str] | None:
        return dict(self.namespaces.get(name, {}))

    def get_claim(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.reads += 1
        found = self.claims.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None


class FakeLimits:
    """Records what the driver asks the MPS servers to allow."""

    def __init__(self) -> None:
        self.raised: list[tuple[str, int, int]] = []

    def raise_for(self, uuid: str, thread_percent: int, memory_bytes: int) -> None:
        self.raised.append((uuid, thread_percent, memory_bytes))


class FakeSlices:
    """A SliceStore keeping slices by name; ``drop_consumable`` plays an API server whose
    DRAConsumableCapacity feature gate is off."""

    def __init__(self, *, drop_consumable: bool = False) -> None:
        self.slices: dict[str, dict[str, Any]] = {}
        self.drop_consumable = drop_consumable
        self.writes: list[str] = []
        self.version = 0

    def _store(self, body: Mapping[str, Any]) -> dict[str, Any]:
        stored = copy.deepcopy(dict(body))
        if self.drop_consumable:
            for device in stored["spec"]["devices"]:
                device.pop("allowMultipleAllocations", None)
                for capacity in device.get("capacity", {}).values():
                    capacity.pop("requestPolicy", None)
        self.version += 1
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.slices[stored["metadata"]["name"]] = stored
        return copy.deepcopy(stored)

    def list_slices(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(s) for s in self.slices.values()]

    def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        assert body["metadata"]["name"] not in self.slices, "create of an existing slice"
        self.writes.append("create")
        return self._store(body)

    def replace_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        current = self.slices[body["metadata"]["name"]]
        assert body["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"]
        self.writes.append("replace")
        return self._store(body)

    def delete_slice(self, name: str) -> None:
        self.writes.append(f"delete {name}")
        self.slices.pop(name, None)


def make_driver(
    tmp_path: Path,
    claims: FakeClaims,
    *,
    limits: FakeLimits | None = None,
    gpus: SimulatedBackend | None = None,
    pods: Callable[[], Iterable[PodInfo]] | None = None,
) -> DraDriver:
    """A driver over simulated GPUs, with its MPS, CDI and checkpoint under ``tmp_path``
    (a second call with the same ``tmp_path`` is the same node after a restart)."""
    gpus = gpus or backend()
    return DraDriver(
        node_name=NODE,
        gpus=gpus.inventory,
        claims=claims,
        checkpoint=Checkpoint(tmp_path / "plugin" / CHECKPOINT_FILE),
        cdi_dir=CdiDir(tmp_path / "cdi"),
        mps=MpsManager(root=tmp_path / "mps", simulated=True),
        limits=limits,
        pods=pods,
        namespace_labels=claims.namespace_labels,
    )
