"""Parsing of GPU fractions and memory quantities as users write them in annotations."""

import math
import re
from decimal import Decimal, InvalidOperation

from gpushare.api.bounds import MAX_BYTES
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import SLICES_PER_GPU

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([A-Za-z]{0,2})$")
_FRACTION_FIX = 'write a fraction like "0.25" or "25%" (0 < f <= 1), or a whole count like "2"'
MAX_QUANTITY_CHARS = 32
"""Longest fraction or memory quantity read: longer ones are refused before any arithmetic."""
MAX_WHOLE_GPUS = 1024
"""Most whole GPUs one pod may ask for."""


def parse_fraction(value: str, *, field: str) -> int:
    """Return the request in GPU-percent slices: "0.25" / "25%" -> 25, "1" -> 100, "2" -> 200.

    Fractions must be whole percents; integers above 1 mean that many whole GPUs.
    """
    text = value.strip()
    if not text:
        raise InvalidInputError(field, "is empty", _FRACTION_FIX)
    if len(text) > MAX_QUANTITY_CHARS:
        raise InvalidInputError(field, f"is {len(text)} characters long", _FRACTION_FIX)
    try:
        if text.endswith("%"):
            number = Decimal(text[:-1].strip())
            percent = number
            if not 0 < number <= 100:
                raise InvalidInputError(
                    field, f"{value!r} is outside 0% < f <= 100%", _FRACTION_FIX
                )
        else:
            number = Decimal(text)
            if number <= 0:
                raise InvalidInputError(field, f"{value!r} must be greater than 0", _FRACTION_FIX)
            if number > 1 and number != number.to_integral_value():
                raise InvalidInputError(
                    field, f"{value!r} is above 1 but not a whole number of GPUs", _FRACTION_FIX
                )
            if number > MAX_WHOLE_GPUS:
                raise InvalidInputError(
                    field, f"{value!r} asks for more than {MAX_WHOLE_GPUS} GPUs", _FRACTION_FIX
                )
            percent = number * SLICES_PER_GPU
        if not percent.is_finite() or percent != percent.to_integral_value():
            raise InvalidInputError(
                field, f"{value!r} is not a whole percent of a GPU", "round it to a whole percent"
            )
    except InvalidOperation:
        raise InvalidInputError(field, f"{value!r} is not a number", _FRACTION_FIX) from None
    except ArithmeticError:  # decimal.Overflow / Underflow of an exponent like 1e999999999
        raise InvalidInputError(field, f"{value!r} is out of range", _FRACTION_FIX) from None
    return int(percent)


def parse_memory(value: str, *, field: str) -> int:
    """Return bytes for a Kubernetes-style quantity: "10Gi", "512Mi", "8G", "1073741824"."""
    fix = 'write a quantity like "10Gi", "512Mi" or a byte count'
    if len(value.strip()) > MAX_QUANTITY_CHARS:
        raise InvalidInputError(field, f"is {len(value.strip())} characters long", fix)
    match = _QUANTITY.match(value.strip())
    if not match:
        raise InvalidInputError(field, f"{value!r} is not a memory quantity", fix)
    number, suffix = Decimal(match.group(1)), match.group(2)
    if suffix in _BINARY:
        scale = _BINARY[suffix]
    elif suffix in _DECIMAL:
        scale = _DECIMAL[suffix]
    elif suffix == "":
        scale = 1
    else:
        raise InvalidInputError(field, f"unknown unit {suffix!r} in {value!r}", fix)
    result = number * scale
    if result <= 0:
        raise InvalidInputError(field, f"{value!r} must be greater than 0", fix)
    if result > MAX_BYTES:
        raise InvalidInputError(field, f"{value!r} is more than 1Ei", fix)
    return math.ceil(result)


def format_memory(num_bytes: int) -> str:
    """Render bytes the way users write them: exact binary units when possible. Total: byte
    counts beyond any parser's bound (2**60) are shown by their size, not their digits."""
    if num_bytes > MAX_BYTES * 1024:
        return f"more than {MAX_BYTES * 1024 // _BINARY['Ei']}Ei"
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        scale = _BINARY[suffix]
        if num_bytes >= scale and num_bytes % scale == 0:
            return f"{num_bytes // scale}{suffix}"
    return str(num_bytes)
