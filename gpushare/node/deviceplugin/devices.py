"""Device IDs the plugin advertises, per GPU (docs/node-agent.md, "Device IDs"):

- ``gpushare.io/gpu-percent``: ``<GPU-UUID>::<NN>``, 100 slices, one per guaranteed percent;
- ``gpushare.io/opportunistic-gpu-percent``: ``<GPU-UUID>::o<NNN>``, 300 slices. Opportunistic
  pods run beyond a GPU's guaranteed capacity, so the kubelet must admit them beside full
  guaranteed shares; the scheduler extender, not the kubelet, keeps each GPU within its
  guaranteed capacity (docs/packing.md, "The sharing contract").
"""

from collections import defaultdict
from collections.abc import Iterable

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import DEVICE_ID_SEPARATOR, OPPORTUNISTIC_SLICES_PER_GPU, SLICES_PER_GPU

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

# The kubelet limits device IDs to 63 characters.
MAX_DEVICE_ID_LENGTH = 63
OPPORTUNISTIC_MARK = "o"
"""Leads the slice number of an opportunistic device ID."""


def device_id(uuid: str, slice_index: int) -> str:
    return f"{uuid}{DEVICE_ID_SEPARATOR}{slice_index:02d}"


def opportunistic_device_id(uuid: str, slice_index: int) -> str:
    return f"{uuid}{DEVICE_ID_SEPARATOR}{OPPORTUNISTIC_MARK}{slice_index:03d}"


def slice_ids(uuid: str) -> list[str]:
    """All 100 slice IDs of one GPU, in slice order."""
    return [device_id(uuid, n) for n in range(SLICES_PER_GPU)]


def opportunistic_slice_ids(uuid: str) -> list[str]:
    """All 300 opportunistic slice IDs of one GPU, in slice order."""
    return [opportunistic_device_id(uuid, n) for n in range(OPPORTUNISTIC_SLICES_PER_GPU)]


def is_opportunistic(value: str) -> bool:
    """Whether ``value`` is an opportunistic slice ID (``<GPU-UUID>::o<NNN>``)."""
    return value.rpartition(DEVICE_ID_SEPARATOR)[2].startswith(OPPORTUNISTIC_MARK)


def capacity_of(ids: Iterable[str]) -> int:
    """Slices per GPU of the resource ``ids`` belong to (300 when any is opportunistic)."""
    return OPPORTUNISTIC_SLICES_PER_GPU if any(map(is_opportunistic, ids)) else SLICES_PER_GPU


def parse_device_id(value: str) -> tuple[str, int]:
    """``"GPU-abc::07"`` -> ``("GPU-abc", 7)``, ``"GPU-abc::o212"`` -> ``("GPU-abc", 212)``;
    InvalidInputError for anything else."""
    uuid, sep, number = value.rpartition(DEVICE_ID_SEPARATOR)
    fix = (
        f"device IDs are <GPU-UUID>{DEVICE_ID_SEPARATOR}<00..99> or "
        f"<GPU-UUID>{DEVICE_ID_SEPARATOR}{OPPORTUNISTIC_MARK}<000..299>, as ListAndWatch "
        "advertised"
    )
    if len(value) > MAX_DEVICE_ID_LENGTH:
        raise InvalidInputError("device ID", f"{value[:70]!r}... is too long", fix)
    digits, limit, width = number, SLICES_PER_GPU, 2
    if number.startswith(OPPORTUNISTIC_MARK):
        digits, limit, width = number[1:], OPPORTUNISTIC_SLICES_PER_GPU, 3
    if not sep or not uuid or not (digits.isascii() and digits.isdigit()) or len(digits) > width:
        raise InvalidInputError("device ID", f"{value!r} is not a gpushare slice ID", fix)
    index = int(digits)
    if not 0 <= index < limit:
        raise InvalidInputError(
            "device ID", f"{value!r} has slice {index} outside 0..{limit - 1}", fix
        )
    return uuid, index


def group_by_gpu(ids: Iterable[str]) -> dict[str, list[int]]:
    """Slice IDs grouped by GPU UUID (GPUs in first-seen order, slices sorted)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for value in ids:
        uuid, index = parse_device_id(value)
        groups[uuid].append(index)
    return {uuid: sorted(slices) for uuid, slices in groups.items()}


def ids_by_gpu(ids: Iterable[str]) -> dict[str, list[str]]:
    """Slice IDs grouped by GPU UUID (GPUs in first-seen order, IDs in slice order)."""
    groups: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for value in ids:
        uuid, index = parse_device_id(value)
        groups[uuid].append((index, value))
    return {uuid: [v for _, v in sorted(found)] for uuid, found in groups.items()}
