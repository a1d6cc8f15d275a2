"""``gpushare.io/gpu-limit``: the most of one GPU a pod may use when its neighbours leave room.

Like a Kubernetes CPU limit beside its request: ``gpushare.io/gpu-fraction`` is what the pod
is guaranteed (placement adds these up to at most one GPU), the limit is the MPS active-thread
cap its processes run with. MPS fixes that cap for a process's life, so it is written once, at
bind (docs/packing.md, "Requests and limits").

Parsing is deliberately narrow and bounded: at most 8 characters, a decimal fraction with up to
two decimals ("0.5", "1") or a whole percent ("50%"), never above one GPU.
"""

import re

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_FRACTION, ANN_LIMIT, SLICES_PER_GPU

MAX_LENGTH = 8
_FRACTION = re.compile(r"^(?:0?\.(\d{1,2})|([01])(?:\.0{1,2})?)$")
_PERCENT = re.compile(r"^(\d{1,3})%$")
_FIX = 'write a fraction of one GPU like "0.5" or "50%" (above 0, at most 1), or remove it'


def parse_limit(value: str, *, field: str = ANN_LIMIT) -> int:
    """The limit in GPU-percent (1..100): "0.5" / "50%" -> 50, "1" / "100%" -> 100."""
    text = value.strip()
    if not text:
        raise InvalidInputError(field, "is empty", _FIX)
    if len(text) > MAX_LENGTH:
        raise InvalidInputError(field, f"is longer than {MAX_LENGTH} characters", _FIX)
    percent: int | None = None
    match = _PERCENT.match(text)
    if match:
        percent = int(match.group(1))
    else:
        match = _FRACTION.match(text)
        if match:
            whole, decimals = match.group(2), match.group(1)
            if whole is not None:
                percent = int(whole) * SLICES_PER_GPU
            else:
                percent = int(decimals.ljust(2, "0"))
    if percent is None:
        raise InvalidInputError(field, f"{text!r} is not a fraction of one GPU", _FIX)
    if not 0 < percent <= SLICES_PER_GPU:
        raise InvalidInputError(
            field,
            f"{text!r} is outside 0 < limit <= 1 (a limit caps a pod within one GPU)",
            _FIX,
        )
    return percent


def check_limit(limit: int | None, percent: int, *, field: str = ANN_LIMIT) -> None:
    """Refuse a limit below the request it goes with (``percent``: the guaranteed GPU-percent;
    0 = not known yet, e.g. a GpuShare not resolved, and nothing is checked)."""
    if limit is None or percent <= 0:
        return
    if percent >= SLICES_PER_GPU and limit < SLICES_PER_GPU:
        raise InvalidInputError(
            field,
            f"{limit}% is below the whole GPU(s) asked in {ANN_FRACTION}",
            "remove it: a pod with whole GPUs is never capped",
        )
    if limit < percent:
        raise InvalidInputError(
            field,
            f"{limit}% is below the {percent}% asked in {ANN_FRACTION} (a pod may always use "
            "what it is guaranteed)",
            f"set it to at least {percent}%, or remove it to let the pod use idle SMs",
        )
