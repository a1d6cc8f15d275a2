"""The pause annotations round-trip, and a hostile value is refused naming the annotation."""

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_PAUSE, ANN_PAUSED
from gpushare.api.pause import (
    REASON_GUARANTEED,
    PauseRequest,
    PauseState,
    load_pause_request,
    load_pause_state,
)


def test_request_and_state_round_trip() -> None:
    request = PauseRequest(
        reason=REASON_GUARANTEED,
        message="a guaranteed pod (ns/a) needs GPU-1",
        since="2026-11-27T15:00:00Z",
    )
    assert load_pause_request(request.dump()) == request
    state = PauseState(since="2026-11-27T15:00:01Z", request_since=request.since)
    assert load_pause_state(state.dump()) == state


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        "null",
        '{"reason": "sleepy", "message": "", "since": ""}',
        '{"reason": 1}',
        "[" * 100,
    ],
)
def test_a_malformed_request_is_refused_naming_the_annotation(text: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        load_pause_request(text)
    assert ANN_PAUSE in str(refused.value)


def test_a_malformed_state_is_refused_naming_the_annotation() -> None:
    with pytest.raises(InvalidInputError) as refused:
        load_pause_state('{"since": "x" }')
    assert ANN_PAUSED in str(refused.value)


def test_the_pods_a_request_was_made_for_round_trip_and_are_optional() -> None:
    request = PauseRequest(
        reason="harm", message="m", since="2026-11-27T15:00:00Z", for_pods=("ns/a", "ns/b")
    )
    assert load_pause_request(request.dump()) == request
    plain = PauseRequest(reason="harm", message="m", since="2026-11-27T15:00:00Z")
    assert "forPods" not in plain.dump()
    with pytest.raises(InvalidInputError) as refused:
        load_pause_request('{"reason": "harm", "message": "", "since": "", "forPods": [1]}')
    assert f"{ANN_PAUSE}.forPods" in str(refused.value)
