"""Allocate's API calls ride out an API server restart instead of failing the pod."""

import pytest

from gpushare.kube import retry


def test_connection_resets_are_retried_until_the_api_server_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(retry.time, "sleep", lambda _s: None)
    answers: list[object] = [ConnectionResetError(104, "Connection reset by peer")] * 3 + ["ok"]

    def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return str(answer)

    assert retry.retry_transient(call, what="list pods") == "ok"
    assert answers == []


def test_a_permanent_error_is_not_retried() -> None:
    calls = 0

    def call() -> str:
        nonlocal calls
        calls += 1
        raise ValueError("bad request body")

    with pytest.raises(ValueError, match="bad request body"):
        retry.retry_transient(call, what="patch pod")
    assert calls == 1
