"""Slice device IDs: ``<GPU-UUID>::<NN>``, 100 per GPU (docs/node-agent.md)."""

from collections import defaultdict
from collections.abc import Iterable

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import DEVICE_ID_SEPARATOR, SLICES_PER_GPU

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

# The kubelet limits device IDs to 63 characters.
MAX_DEVICE_ID_LENGTH = 63


def device_id(uuid: str, slice_index: int) -> str:
    return f"{uuid}{DEVICE_ID_SEPARATOR}{slice_index:02d}"


def slice_ids(uuid: str) -> list[str]:
    """All 100 slice IDs of one GPU, in slice order."""
    return [device_id(uuid, n) for n in range(SLICES_PER_GPU)]


def parse_device_id(value: str) -> tuple[str, int]:
    """``"GPU-abc::07"`` -> ``("GPU-abc", 7)``; InvalidInputError for anything else."""
    uuid, sep, number = value.rpartition(DEVICE_ID_SEPARATOR)
    fix = f"device IDs are <GPU-UUID>{DEVICE_ID_SEPARATOR}<00..99>, as ListAndWatch advertised"
    if len(value) > MAX_DEVICE_ID_LENGTH:
        raise InvalidInputError("device ID", f"{value[:70]!r}... is too long", fix)
    if not sep or not uuid or not (number.isascii() and number.isdigit()) or len(number) > 2:
        raise InvalidInputError("device ID", f"{value!r} is not a gpushare slice ID", fix)
    index = int(number)
    if not 0 <= index < SLICES_PER_GPU:
        raise InvalidInputError("device ID", f"{value!r} has slice {index} outside 0..99", fix)
    return uuid, index


def group_by_gpu(ids: Iterable[str]) -> dict[str, list[int]]:
    """Slice IDs grouped by GPU UUID (GPUs in first-seen order, slices sorted)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for value in ids:
        uuid, index = parse_device_id(value)
        groups[uuid].append(index)
    return {uuid: sorted(slices) for uuid, slices in groups.items()}
