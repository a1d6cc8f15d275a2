"""Parsing of GPU fractions and memory quantities as users write them in annotations, and of
Kubernetes resource quantities (CPU and memory requests, node allocatable) as the API server
stores them."""

import math
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

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
    if not text.isascii() or "_" in text:
        # Decimal reads "\u0663" as 3 and "1_0" as 10: spellings other readers of the
        # annotation (kubectl, dashboards) would not agree with.
        raise InvalidInputError(field, f"{value!r} is not a number", _FRACTION_FIX)
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


INT64_MAX = 2**63 - 1
"""Where a Kubernetes quantity read as a whole number saturates: the API server stores
exponents near a million ("1e999999"), kube-scheduler's int64 arithmetic cannot fit such a
request anywhere, and neither can gpushare's."""
_KUBE_QUANTITY = re.compile(
    r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:[eE]([+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)"
)
_SI_EXPONENT = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_POWER = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_MAX_KUBE_CHARS = 64
_LOG10_2 = 0.30103


def kube_quantity(value: object, *, milli: bool = False) -> int | None:
    """A Kubernetes resource quantity ("500m", "2", "16Gi", "1e3", "1.5k") as a whole number
    of its unit, or of thousandths of it with ``milli`` (CPU), rounded up as kube-scheduler's
    ``Value``/``MilliValue`` round; None when it is not a quantity the API server would store
    (or negative). Total: exponents of any size saturate at :data:`INT64_MAX` or round up to
    1, without building the number (docs/security.md, "Parsing is total")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if value < 0 else min(value * (1000 if milli else 1), INT64_MAX)
    if isinstance(value, float):
        value = repr(value) if math.isfinite(value) else ""
    if not isinstance(value, str) or not value or len(value) > _MAX_KUBE_CHARS:
        return None
    match = _KUBE_QUANTITY.fullmatch(value)
    if match is None:
        return None
    sign, number, exponent_text, suffix = match.groups()
    whole, _, fraction = number.partition(".")
    digits = (whole + fraction).lstrip("0")
    if not digits:
        return 0
    if sign == "-":
        return None
    exponent = -len(fraction) + (3 if milli else 0)
    binary = 0
    if exponent_text is not None:
        exponent += int(exponent_text)  # at most 62 digits: the text is bounded
    elif suffix in _BINARY_POWER:
        binary = _BINARY_POWER[suffix]
    else:
        exponent += _SI_EXPONENT[suffix or ""]
    magnitude = len(digits) + exponent + binary * _LOG10_2  # about log10 of the value
    if magnitude > 20:
        return INT64_MAX
    if magnitude < -20:
        return 1
    exact = Fraction(int(digits)) * Fraction(10) ** exponent * 2**binary
    rounded: int = math.ceil(exact)
    return min(rounded, INT64_MAX)
