"""Who may read gpushare's metrics and profiles: a bearer token checked by the API server.

The controller's ``/metrics`` lists every namespace's GpuShares and their measured profiles; a
node agent's ``/metrics`` and ``/profile`` list every pod on its node (issue #45). They answer
only a caller whose bearer token the API server authenticates (TokenReview) and authorizes to
``get`` that path (SubjectAccessReview on the non-resource URL), as kubelets and
controller-runtime's metrics endpoints do, so Prometheus scrapes with its ServiceAccount token
and a ClusterRole rule ``nonResourceURLs: ["/metrics"], verbs: [get]`` (kube-prometheus-stack's
Prometheus has it). A path may ask for its own token audience: the operator presents the agents
a token bound to :data:`PROFILE_AUDIENCE`, which the API server itself refuses, so a token read
off the node network opens nothing but profiles (docs/security.md, "Metrics and profiles").

Answers are cached by a hash of the token (allowed 60 s, refused 10 s), the allowed and the
refused apart (4096 entries each), so made-up tokens never push a scraper's grant out. Each
client address may have at most :data:`REVIEWS_PER_CLIENT` tokens not known to be good
reviewed per :data:`REVIEW_WINDOW_S` (and all clients together :data:`REVIEWS_TOTAL`): past
that a made-up token gets 429 without a review, so a flood of them costs the API server a
bounded number of TokenReviews (issue 67). A token allowed before is re-reviewed when its answer
expires whatever the budget. An API server that cannot be asked refuses (503), never admits.
"""

import hashlib
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar, cast

from lightkube import AsyncClient, Client
from lightkube.resources.authentication_v1 import TokenReview
from lightkube.resources.authorization_v1 import SubjectAccessReview

from gpushare.api.endpoints import AGENT_TOKEN_AUDIENCE

log = logging.getLogger(__name__)

PROFILE_AUDIENCE: Final = AGENT_TOKEN_AUDIENCE
"""The audience of the tokens the operator presents to node agents for ``/profile``."""
MAX_TOKEN_CHARS: Final = 16 * 1024
ALLOWED_TTL_S: Final = 60.0
REFUSED_TTL_S: Final = 10.0
MAX_CACHED: Final = 4096
REVIEW_WINDOW_S: Final = 60.0
REVIEWS_PER_CLIENT: Final = 10
"""TokenReviews one client address may cause per window for tokens not known to be good (a
scraper has one token per path; its restarts and rotations take a few)."""
REVIEWS_TOTAL: Final = 600
"""TokenReviews all clients together may cause per window for such tokens."""
MAX_CLIENTS: Final = 4096
_TOKEN = re.compile(r"[A-Za-z0-9._~+/=-]+")


@dataclass(frozen=True)
class Access:
    """The answer for one request: ``status`` 200 (allowed), 401 (no usable token), 403 (the
    token's user may not), 503 (the API server could not be asked); ``reason`` names the
    caller, the path and the fix."""

    status: int
    reason: str
    user: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == 200


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None for anything else."""
    if not header or len(header) > MAX_TOKEN_CHARS + 7:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not _TOKEN.fullmatch(token):
        return None
    return token


def _missing(path: str) -> Access:
    return Access(
        401,
        f"{path} needs a bearer token (Authorization: Bearer <token>) of a ServiceAccount allowed "
        f"to get the non-resource URL {path}; fix: scrape with a ServiceAccount token (the "
        "chart's ServiceMonitors send its metrics-scraper's through authorization) and grant it "
        f'nonResourceURLs: ["{path}"], verbs: [get]',
    )


def _refused_token(path: str, why: str) -> Access:
    return Access(
        401, f"{path}: the API server does not accept this token ({why}); fix: send a current "
        "ServiceAccount token",
    )  # fmt: skip


def _forbidden(path: str, user: str, why: str) -> Access:
    return Access(
        403,
        f"{path}: {user} may not get it ({why or 'no RBAC rule allows it'}); fix: bind it a "
        f'ClusterRole with nonResourceURLs: ["{path}"], verbs: [get]',
        user,
    )


def _over_budget(path: str, client: str) -> Access:
    return Access(
        429,
        f"{path}: too many unknown tokens from {client or 'this client'} lately (at most "
        f"{REVIEWS_PER_CLIENT} a minute are checked with the API server); fix: send a current "
        "ServiceAccount token, and retry in a minute",
    )


def _unavailable(path: str, exc: Exception) -> Access:
    return Access(503, f"{path}: the token cannot be checked now ({exc}); retry shortly")


def token_review(token: str, audiences: Sequence[str]) -> TokenReview:
    spec: dict[str, Any] = {"token": token}
    if audiences:
        spec["audiences"] = list(audiences)
    doc = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
    return cast(TokenReview, TokenReview.from_dict(doc))


def access_review(user: Mapping[str, Any], path: str, verb: str) -> SubjectAccessReview:
    extra = user.get("extra")
    doc = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": str(user.get("username") or ""),
            "uid": str(user.get("uid") or ""),
            "groups": [str(g) for g in user.get("groups") or []],
            "extra": dict(extra) if isinstance(extra, Mapping) else {},
            "nonResourceAttributes": {"path": path, "verb": verb},
        },
    }
    return cast(SubjectAccessReview, SubjectAccessReview.from_dict(doc))


def judge_token(path: str, status: Mapping[str, Any]) -> tuple[Access | None, Mapping[str, Any]]:
    """A TokenReview's status: (a refusal, {}) or (None, the user to authorize)."""
    if not status.get("authenticated"):
        return _refused_token(path, str(status.get("error") or "not authenticated")), {}
    user = status.get("user")
    return None, user if isinstance(user, Mapping) else {}


def judge_access(path: str, user: Mapping[str, Any], status: Mapping[str, Any]) -> Access:
    name = str(user.get("username") or "?")
    if status.get("allowed") and not status.get("denied"):
        return Access(200, "allowed", name)
    return _forbidden(path, name, str(status.get("reason") or ""))


class AccessCache:
    """Answers by (token hash, path, verb), expiring; the allowed and the refused apart, each
    bounded in entries; and each client's budget of reviews of tokens not known to be good."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._allowed: OrderedDict[str, tuple[float, Access]] = OrderedDict()
        self._refused: OrderedDict[str, tuple[float, Access]] = OrderedDict()
        self._good: OrderedDict[str, None] = OrderedDict()
        """Keys once allowed (their answer may have expired): re-reviewed whatever the budget."""
        self._spent: dict[str, list[float]] = {}
        """Per client address, when it caused reviews of unknown tokens (this window)."""
        self._spent_total: list[float] = []
        self._lock = threading.Lock()  # the agent answers from several threads
        self.reviews = 0
        """Answers that had to ask the API server (a counter, for tests and metrics)."""
        self.over_budget = 0
        """Unknown tokens refused without a review (a client past its budget)."""

    @staticmethod
    def key(token: str, path: str, verb: str) -> str:
        return hashlib.sha256(f"{verb} {path} {token}".encode(errors="replace")).hexdigest()

    def get(self, key: str) -> Access | None:
        with self._lock:
            for entries in (self._allowed, self._refused):
                found = entries.get(key)
                if found is None:
                    continue
                if found[0] < self.clock():
                    del entries[key]
                    return None
                return found[1]
            return None

    def spend(self, key: str, client: str) -> bool:
        """May ``client`` have the token of ``key`` reviewed now: it was allowed before, or the
        client (and all clients together) have budget left this window; counts it."""
        with self._lock:
            if key in self._good:
                return True
            now = self.clock()
            start = now - REVIEW_WINDOW_S
            mine = [t for t in self._spent.get(client, ()) if t > start]
            self._spent_total = [t for t in self._spent_total if t > start]
            if len(mine) >= REVIEWS_PER_CLIENT or len(self._spent_total) >= REVIEWS_TOTAL:
                self._spent[client] = mine
                self.over_budget += 1
                return False
            mine.append(now)
            self._spent_total.append(now)
            self._spent[client] = mine
            if len(self._spent) > MAX_CLIENTS:
                self._spent = {c: t for c, t in self._spent.items() if t and t[-1] > start}
            return True

    def put(self, key: str, access: Access) -> None:
        if access.status in (429, 503):
            return  # not the token's answer: ask again next time
        entries = self._allowed if access.allowed else self._refused
        ttl = ALLOWED_TTL_S if access.allowed else REFUSED_TTL_S
        with self._lock:
            entries[key] = (self.clock() + ttl, access)
            entries.move_to_end(key)
            while len(entries) > MAX_CACHED:
                entries.popitem(last=False)
            if access.allowed:
                self._good[key] = None
                self._good.move_to_end(key)
                while len(self._good) > MAX_CACHED:
                    self._good.popitem(last=False)

    def __len__(self) -> int:
        return len(self._allowed) + len(self._refused)


_C = TypeVar("_C", AsyncClient, Client)


class _Reviewer(Generic[_C]):
    """What both reviewers share: the audiences by path, the cache, and each step of a review
    that asks nothing of the API server; the two reviews ask it through their own client."""

    def __init__(self, client: _C, *, audiences: Mapping[str, Sequence[str]] | None = None) -> None:
        self._client: _C = client
        self._audiences = dict(audiences or {})
        self.cache = AccessCache()

    def _known(
        self, authorization: str | None, path: str, verb: str, client: str
    ) -> Access | tuple[str, str]:
        """The answer when the API server need not be asked (no usable token, cached, or the
        client past its budget of unknown tokens); else the cache key and the token, the
        review counted."""
        token = bearer_token(authorization)
        if token is None:
            return _missing(path)
        key = AccessCache.key(token, path, verb)
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        if not self.cache.spend(key, client):
            return _over_budget(path, client)
        self.cache.reviews += 1
        return key, token

    def _token_review(self, token: str, path: str) -> TokenReview:
        return token_review(token, self._audiences.get(path, ()))

    def _answered(self, key: str, access: Access) -> Access:
        self.cache.put(key, access)
        return access


def _failed(path: str, exc: Exception) -> Access:
    log.warning("access review failed", extra={"path": path, "error": str(exc)})
    return _unavailable(path, exc)


class AsyncAccessReviewer(_Reviewer[AsyncClient]):
    """The controller's reviewer (lightkube's AsyncClient)."""

    async def review(
        self, authorization: str | None, path: str, verb: str = "get", *, client: str = ""
    ) -> Access:
        known = self._known(authorization, path, verb, client)
        if isinstance(known, Access):
            return known
        key, token = known
        try:
            reviewed = await self._client.create(self._token_review(token, path))
            access, user = judge_token(path, reviewed.to_dict().get("status") or {})
            if access is None:
                answer = await self._client.create(access_review(user, path, verb))
                access = judge_access(path, user, answer.to_dict().get("status") or {})
        except Exception as exc:
            return _failed(path, exc)
        return self._answered(key, access)


class AccessReviewer(_Reviewer[Client]):
    """The node agent's reviewer (lightkube's blocking Client, from its HTTP threads)."""

    def review(
        self, authorization: str | None, path: str, verb: str = "get", *, client: str = ""
    ) -> Access:
        """``client``: the caller's address, whose budget of unknown tokens is counted."""
        known = self._known(authorization, path, verb, client)
        if isinstance(known, Access):
            return known
        key, token = known
        try:
            reviewed = self._client.create(self._token_review(token, path))
            access, user = judge_token(path, reviewed.to_dict().get("status") or {})
            if access is None:
                answer = self._client.create(access_review(user, path, verb))
                access = judge_access(path, user, answer.to_dict().get("status") or {})
        except Exception as exc:
            return _failed(path, exc)
        return self._answered(key, access)
