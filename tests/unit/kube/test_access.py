"""Metrics and profiles answer only callers the API server vouches for (issue #45): a bearer
token authenticated by a TokenReview and allowed by a SubjectAccessReview on the path; each
refusal names the caller, the path and the fix; answers are cached by token hash and bounded.
The API server's side is a stand-in that answers as the real one does; the real API server is
tests/faults/test_security_cluster.py (``reads_metrics_and_profiles_with_a_tenant_token``)."""

import asyncio
import base64
from typing import Any

import pytest

from gpushare.kube.access import (
    MAX_CACHED,
    PROFILE_AUDIENCE,
    REVIEWS_PER_CLIENT,
    REVIEWS_TOTAL,
    AccessReviewer,
    AsyncAccessReviewer,
    bearer_token,
)

PROMETHEUS = "system:serviceaccount:monitoring:prometheus"
TENANT = "system:serviceaccount:team:default"


class Answer:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc

    def to_dict(self) -> dict[str, Any]:
        return self.doc


def tok(user: str, kind: str = "tok") -> str:
    """The Authorization header of ``user``'s token (``aud``: bound to PROFILE_AUDIENCE)."""
    return f"Bearer {kind}-{base64.urlsafe_b64encode(user.encode()).decode()}"


class ApiServer:
    """TokenReview: ``tok-<user>`` authenticates as that user (audience-bound tokens
    ``aud-<user>`` only for PROFILE_AUDIENCE); SubjectAccessReview: ``grants`` (user, path)."""

    def __init__(self, grants: set[tuple[str, str]], *, down: bool = False) -> None:
        self.grants = grants
        self.down = down
        self.calls: list[str] = []

    def create(self, obj: Any) -> Answer:
        if self.down:
            raise ConnectionError("API server unreachable")
        doc = obj.to_dict()
        self.calls.append(doc["kind"])
        spec = doc["spec"]
        if doc["kind"] == "TokenReview":
            token, audiences = spec["token"], spec.get("audiences", [])
            prefix = "aud-" if audiences == [PROFILE_AUDIENCE] else "tok-"
            user = (
                base64.urlsafe_b64decode(token[len(prefix) :]).decode()
                if token.startswith(prefix)
                else None
            )
            if user is None:
                return Answer({"status": {"authenticated": False, "error": "invalid bearer token"}})
            return Answer({"status": {"authenticated": True, "user": {"username": user}}})
        path = spec["nonResourceAttributes"]["path"]
        return Answer({"status": {"allowed": (spec["user"], path) in self.grants}})


class AsyncApiServer(ApiServer):
    async def create(self, obj: Any) -> Answer:  # type: ignore[override]
        return ApiServer.create(self, obj)


@pytest.mark.parametrize(
    "header",
    [None, "", "Basic dXNlcjpwdw==", "Bearer", "Bearer ", "Bearer a b", "Bearer \x1b[2J",
     "Bearer " + "x" * 20_000],
)  # fmt: skip
def test_anything_but_a_bearer_token_is_no_token(header: str | None) -> None:
    assert bearer_token(header) is None


def test_a_scraper_allowed_to_get_metrics_reads_them_and_a_tenant_does_not() -> None:
    api = ApiServer({(PROMETHEUS, "/metrics")})
    reviewer = AccessReviewer(api)  # type: ignore[arg-type]
    assert reviewer.review(tok(PROMETHEUS), "/metrics").allowed
    missing = reviewer.review(None, "/metrics")
    assert missing.status == 401 and "authorization" in missing.reason
    forged = reviewer.review("Bearer made-up", "/metrics")
    assert forged.status == 401 and "does not accept this token" in forged.reason
    tenant = reviewer.review(tok(TENANT), "/metrics")
    assert tenant.status == 403 and TENANT in tenant.reason
    assert 'nonResourceURLs: ["/metrics"]' in tenant.reason
    assert reviewer.review(tok(PROMETHEUS), "/profile").status == 403  # per path


def test_profiles_take_only_tokens_bound_to_the_node_agent_audience() -> None:
    """The operator's token for /profile is bound to PROFILE_AUDIENCE, which the API server
    itself refuses: a token read off the node network opens nothing else. A plain token of the
    same account does not open /profile."""
    operator = "system:serviceaccount:gpushare-system:gpushare-controller"
    api = ApiServer({(operator, "/profile")})
    reviewer = AccessReviewer(api, audiences={"/profile": [PROFILE_AUDIENCE]})  # type: ignore[arg-type]
    assert reviewer.review(tok(operator, "aud"), "/profile").allowed
    assert reviewer.review(tok(operator), "/profile").status == 401


def test_answers_are_cached_by_token_and_a_flood_of_tokens_stays_bounded() -> None:
    now = [0.0]
    api = ApiServer({(PROMETHEUS, "/metrics")})
    reviewer = AccessReviewer(api)  # type: ignore[arg-type]
    reviewer.cache.clock = lambda: now[0]
    for _ in range(5):
        assert reviewer.review(tok(PROMETHEUS), "/metrics").allowed
    assert api.calls == ["TokenReview", "SubjectAccessReview"]
    now[0] = 61  # allowed answers are asked again after a minute (a revoked grant shows)
    reviewer.review(tok(PROMETHEUS), "/metrics")
    assert len(api.calls) == 4
    for n in range(MAX_CACHED + 500):
        reviewer.review(f"Bearer junk{n}", "/metrics", client=f"10.0.{n // 250}.{n % 250}")
    assert len(reviewer.cache) <= MAX_CACHED + 1
    assert len(api.calls) <= 4 + REVIEWS_TOTAL  # one TokenReview each, up to the total budget


def test_made_up_tokens_cost_one_client_a_few_reviews_and_never_evict_a_grant() -> None:
    """Issue 67: every made-up bearer token cost a TokenReview (unbounded API-server load) and
    a flood of them pushed Prometheus's cached grant out. Now one client gets at most
    REVIEWS_PER_CLIENT unknown tokens reviewed a minute (429 after, without a review), and
    allowed answers are kept apart from refused ones."""
    now = [0.0]
    api = ApiServer({(PROMETHEUS, "/metrics")})
    reviewer = AccessReviewer(api)  # type: ignore[arg-type]
    reviewer.cache.clock = lambda: now[0]
    assert reviewer.review(tok(PROMETHEUS), "/metrics", client="prometheus").allowed
    answers = [
        reviewer.review(f"Bearer made-up-{n}", "/metrics", client="10.244.0.9")
        for n in range(MAX_CACHED + 100)
    ]
    reviews = api.calls.count("TokenReview")
    assert reviews == 1 + REVIEWS_PER_CLIENT
    assert answers[-1].status == 429 and "too many unknown tokens" in answers[-1].reason
    assert reviewer.review(tok(PROMETHEUS), "/metrics", client="prometheus").allowed
    assert api.calls.count("TokenReview") == reviews  # still cached: no review
    now[0] = 61  # the grant expired; the flooder's budget too, but a known token is re-checked
    for n in range(REVIEWS_PER_CLIENT):
        reviewer.review(f"Bearer again-{n}", "/metrics", client="10.244.0.9")
    assert reviewer.review(tok(PROMETHEUS), "/metrics", client="10.244.0.9").allowed


def test_an_api_server_that_cannot_be_asked_refuses_and_is_asked_again() -> None:
    api = ApiServer({(PROMETHEUS, "/metrics")}, down=True)
    reviewer = AccessReviewer(api)  # type: ignore[arg-type]
    down = reviewer.review(tok(PROMETHEUS), "/metrics")
    assert down.status == 503 and "retry" in down.reason
    api.down = False
    assert reviewer.review(tok(PROMETHEUS), "/metrics").allowed


def test_the_controllers_reviewer_answers_alike() -> None:
    api = AsyncApiServer({(PROMETHEUS, "/metrics")})
    reviewer = AsyncAccessReviewer(api)  # type: ignore[arg-type]

    async def scenario() -> list[int]:
        return [
            (await reviewer.review(tok(who), "/metrics")).status for who in (PROMETHEUS, TENANT)
        ] + [(await reviewer.review(None, "/metrics")).status]

    assert asyncio.run(scenario()) == [200, 403, 401]
