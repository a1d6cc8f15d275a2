"""The node's GPU inventory, published as JSON in the ``gpushare.io/gpus`` node annotation."""

import json
from dataclasses import asdict, dataclass
from typing import Any

from gpushare.api.bounds import MAX_BYTES, load_json
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_NODE_GPUS

MAX_GPUS_PER_NODE = 256
"""Most GPUs one node's inventory lists."""


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU on a node, as the node agent sees it."""

    uuid: str
    index: int
    model: str
    memory_bytes: int
    sm_count: int
    compute_capability: str
    healthy: bool = True
    mps_ready: bool = False
    simulated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def dump_inventory(gpus: list[GpuInfo]) -> str:
    return json.dumps([g.to_dict() for g in gpus], separators=(",", ":"), sort_keys=True)


def load_inventory(text: str) -> list[GpuInfo]:
    """Parse the node annotation; raises InvalidInputError naming the annotation on bad JSON."""
    fix = "the node agent rewrites it; delete the annotation and restart the node agent"
    raw = load_json(text, field=ANN_NODE_GPUS, fix=fix, max_chars=64 * 1024)
    if not isinstance(raw, list):
        raise InvalidInputError(ANN_NODE_GPUS, "must be a JSON list of GPUs", fix)
    if len(raw) > MAX_GPUS_PER_NODE:
        raise InvalidInputError(
            ANN_NODE_GPUS, f"lists {len(raw)} GPUs (at most {MAX_GPUS_PER_NODE})", fix
        )
    gpus: list[GpuInfo] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise InvalidInputError(f"{ANN_NODE_GPUS}[{i}]", "must be an object", fix)
        try:
            info = GpuInfo(
                uuid=str(item["uuid"]),
                index=int(item["index"]),
                model=str(item["model"]),
                memory_bytes=int(item["memory_bytes"]),
                sm_count=int(item.get("sm_count", 0)),
                compute_capability=str(item.get("compute_capability", "")),
                healthy=bool(item.get("healthy", True)),
                mps_ready=bool(item.get("mps_ready", False)),
                simulated=bool(item.get("simulated", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInputError(
                f"{ANN_NODE_GPUS}[{i}]", f"bad or missing field {exc}", fix
            ) from None
        if not 0 <= info.index < 1024 or not 0 <= info.memory_bytes <= MAX_BYTES:
            raise InvalidInputError(
                f"{ANN_NODE_GPUS}[{i}]", "index or memory_bytes is out of range", fix
            )
        if len(info.uuid) > 128 or not info.uuid:
            raise InvalidInputError(f"{ANN_NODE_GPUS}[{i}].uuid", "is empty or too long", fix)
        gpus.append(info)
    return gpus
