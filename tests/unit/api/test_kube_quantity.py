"""Kubernetes resource quantities read totally: every spelling the API server stores, bounded
however large its exponent (issue #45: one pod's "1e999999" CPU request froze the pod list)."""

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.api.quantities import INT64_MAX, kube_quantity


@pytest.mark.parametrize(
    ("text", "milli", "expected"),
    [
        ("2", False, 2),
        ("2", True, 2000),
        ("250m", True, 250),
        ("250m", False, 1),
        ("1Ki", False, 1024),
        ("1.5Gi", False, 3 << 29),
        ("1k", False, 1000),
        ("1e3", False, 1000),
        ("1E3", False, 1000),
        ("1E", False, 10**18),
        ("1e+3", False, 1000),
        ("1e-3", True, 1),
        ("0", True, 0),
        ("0.000", False, 0),
        ("-0", False, 0),
        ("1e999999", False, INT64_MAX),
        ("1e999999999999999999999999999999999999999999999999999", True, INT64_MAX),
        ("1e-999999999999999999999999999999999999999999999999999", True, 1),
        ("9" * 60, False, INT64_MAX),
        ("0." + "0" * 58 + "1", False, 1),
        (5, True, 5000),
        (0.5, True, 500),
    ],
)
def test_quantities_read_as_kube_scheduler_counts_them(
    text: object, milli: bool, expected: int
) -> None:
    assert kube_quantity(text, milli=milli) == expected


@pytest.mark.parametrize(
    "junk",
    ["", "-1", "-1e999999", "1e", "e3", "1Ki2", "1KiB", "0x10", "1_000", "NaN", "Infinity",
     " 1", "1 ", "\u0663", "1" * 70, None, True, [], {}, float("nan"), float("inf"), -3],
)  # fmt: skip
def test_what_is_not_a_stored_quantity_reads_as_none(junk: object) -> None:
    assert kube_quantity(junk) is None


@given(st.text(alphabet="0123456789.eE+-kKMGTPinum", max_size=64), st.booleans())
def test_any_quantity_text_is_answered_fast_and_within_int64(text: str, milli: bool) -> None:
    started = time.perf_counter()
    value = kube_quantity(text, milli=milli)
    assert time.perf_counter() - started < 0.05
    assert value is None or 0 <= value <= INT64_MAX
