"""gpushare.io/gpu-limit beside gpushare.io/gpu-fraction: parsing, refusals that name the field
and the fix, and the request the scheduler records at bind."""

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.api.errors import InvalidInputError
from gpushare.api.limit import parse_limit
from gpushare.api.names import ANN_FRACTION, ANN_LIMIT, ANN_REQUEST_PERCENT
from gpushare.api.placement import Placement, parse_placement
from gpushare.api.request import parse_request


@pytest.mark.parametrize(
    ("text", "percent"),
    [("0.5", 50), (".25", 25), ("0.05", 5), ("1", 100), ("1.00", 100), ("60%", 60), (" 7% ", 7)],
)
def test_limits_read_as_fractions_or_percents_of_one_gpu(text: str, percent: int) -> None:
    assert parse_limit(text) == percent


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "is empty"),
        ("0", "outside 0 < limit <= 1"),
        ("0%", "outside 0 < limit <= 1"),
        ("101%", "outside 0 < limit <= 1"),
        ("2", "is not a fraction of one GPU"),
        ("0.125", "is not a fraction of one GPU"),
        ("1e0", "is not a fraction of one GPU"),
        ("half", "is not a fraction of one GPU"),
        ("0." + "5" * 100, "longer than 8 characters"),
    ],
)
def test_bad_limits_are_refused_naming_the_annotation(text: str, problem: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        parse_limit(text)
    assert caught.value.field == ANN_LIMIT
    assert problem in caught.value.problem


@given(st.text(max_size=40))
def test_any_text_parses_to_1_to_100_or_is_refused_cleanly(text: str) -> None:
    try:
        assert 1 <= parse_limit(text) <= 100
    except InvalidInputError as exc:
        assert exc.field == ANN_LIMIT


def test_the_request_carries_the_limit_and_refuses_one_below_the_fraction() -> None:
    request = parse_request({ANN_FRACTION: "0.25", ANN_LIMIT: "0.6"})
    assert request is not None and (request.percent, request.limit_percent) == (25, 60)
    default = parse_request({ANN_FRACTION: "0.25"})
    assert default is not None and default.limit_percent is None
    with pytest.raises(InvalidInputError, match="at least 25%"):
        parse_request({ANN_FRACTION: "0.25", ANN_LIMIT: "20%"})
    with pytest.raises(InvalidInputError, match=f"is set without {ANN_FRACTION}"):
        parse_request({ANN_LIMIT: "20%"})


def test_placement_records_the_request_beside_the_effective_cap() -> None:
    placed = Placement(("GPU-1",), 100, 1 << 30, datetime(2026, 1, 1, tzinfo=UTC), "assumed", 25)
    annotations = placed.to_annotations()
    assert annotations[ANN_REQUEST_PERCENT] == "25"
    back = parse_placement(annotations)
    assert back == placed and back.guaranteed_percent == 25
    older = dict(annotations)
    del older[ANN_REQUEST_PERCENT]
    old = parse_placement(older)
    assert old is not None and old.request_percent is None and old.guaranteed_percent == 100
    for bad in ("0", "101", "2.5", "²", "9" * 20):
        with pytest.raises(InvalidInputError, match=ANN_REQUEST_PERCENT):
            parse_placement({**annotations, ANN_REQUEST_PERCENT: bad})
