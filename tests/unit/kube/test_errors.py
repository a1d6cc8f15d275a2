"""A failed API call raises one typed error per answer a caller acts on, whichever client made
it, and only no answer, 429 and 5xx are worth trying again."""

import httpx2
import pytest
from lightkube import ApiError

from gpushare.kube.errors import (
    ConflictError,
    ForbiddenError,
    GoneError,
    KubeError,
    NotFoundError,
    ServerError,
    TooManyRequestsError,
    UnprocessableError,
    UnreachableError,
    error_for,
    translated,
)
from gpushare.kube.retry import Backoff, transient


def api_error(code: int, message: str, causes: list[dict[str, str]] | None = None) -> ApiError:
    status = {"kind": "Status", "code": code, "message": message}
    if causes is not None:
        status["details"] = {"causes": causes}  # type: ignore[assignment]
    request = httpx2.Request("GET", "https://api/x")
    return ApiError(request=request, response=httpx2.Response(code, json=status, request=request))


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (403, ForbiddenError),
        (404, NotFoundError),
        (409, ConflictError),
        (410, GoneError),
        (422, UnprocessableError),
        (429, TooManyRequestsError),
        (503, ServerError),
    ],
)
def test_each_status_a_caller_acts_on_is_its_own_error(code: int, kind: type[KubeError]) -> None:
    with pytest.raises(kind) as raised, translated("get pod a/b"):
        raise api_error(code, "nope")
    assert raised.value.status == code
    assert str(raised.value) == "get pod a/b: nope"
    assert type(error_for(code, "x")) is kind


def test_a_schema_violation_keeps_its_causes_and_a_failed_test_op_has_none() -> None:
    with pytest.raises(UnprocessableError) as violated, translated("patch"):
        raise api_error(422, "invalid", [{"field": "status.phase", "message": "bad"}])
    assert violated.value.causes == ("status.phase",)
    with pytest.raises(UnprocessableError) as tested, translated("patch"):
        raise api_error(422, "the test failed")
    assert tested.value.causes == ()


def test_only_no_answer_throttling_and_server_errors_are_transient() -> None:
    assert transient(ConnectionResetError(104, "reset"))
    assert transient(httpx2.ConnectError("refused"))
    assert transient(api_error(429, "slow down")) and transient(api_error(500, "oops"))
    assert not transient(api_error(404, "gone")) and not transient(ValueError("bad body"))
    with pytest.raises(UnreachableError), translated("list pods"):
        raise OSError("no route to host")


def test_backoff_doubles_up_to_its_ceiling() -> None:
    delays = Backoff(first_s=0.5, most_s=3.0).delays()
    assert [next(delays) for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
