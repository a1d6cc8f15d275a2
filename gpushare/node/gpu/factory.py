"""Pick a GPU backend from the node agent's ``--backend`` value."""

from gpushare.api.errors import InvalidInputError
from gpushare.node.gpu.backend import GpuBackend

_FIELD = "--backend"
_FIX = 'use "nvml" on a GPU node, or "simulated:<count>x<model>" (e.g. "simulated:2xH100-80GB")'


def open_backend(value: str, *, node_name: str) -> GpuBackend:
    """``nvml`` -> NvmlBackend; ``simulated:<spec>`` -> SimulatedBackend (announces itself)."""
    text = value.strip()
    if text == "nvml":
        from gpushare.node.gpu.nvml import NvmlBackend  # noqa: PLC0415  (needs libnvidia-ml)

        return NvmlBackend()
    if text.startswith("simulated:"):
        from gpushare.node.gpu.simulated import SimulatedBackend  # noqa: PLC0415

        return SimulatedBackend(text.removeprefix("simulated:"), node_name=node_name)
    if text == "simulated":
        raise InvalidInputError(_FIELD, "names no simulated GPUs", _FIX)
    raise InvalidInputError(_FIELD, f"unknown backend {value!r}", _FIX)
