"""What a failed API call raises: one exception per answer a caller acts on, as Kopf's
``clients/errors.py`` does, so no caller compares HTTP status codes.

Every call of :mod:`gpushare.kube` turns the client library's errors into these once
(:func:`translated`), whichever client made the call (lightkube or :mod:`gpushare.kube.raw`).
"""

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import httpx2
from lightkube import ApiError


class KubeError(Exception):
    """An API call that failed; ``status`` is the HTTP status (0 when none came back) and
    ``causes`` the fields the API server named (a schema violation lists them)."""

    def __init__(self, message: str, *, status: int = 0, causes: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.causes = tuple(causes)


class UnreachableError(KubeError):
    """No answer: the connection failed or broke (an API server restarting)."""


class BadRequestError(KubeError):
    """400: the request itself is wrong (a malformed label selector)."""


class ForbiddenError(KubeError):
    """403: the caller may not (RBAC), or the API is not served to it."""


class NotFoundError(KubeError):
    """404: no such object (or no such API)."""


class ConflictError(KubeError):
    """409: the object changed since it was read (a stale ``resourceVersion``) or exists."""


class GoneError(KubeError):
    """410: a watch's ``resourceVersion`` is too old; list again."""


class UnprocessableError(KubeError):
    """422: the API server refused the body (a failed JSON-patch ``test`` lists no causes)."""


class TooManyRequestsError(KubeError):
    """429: try later (an eviction a PodDisruptionBudget blocks, or throttling)."""


class ServerError(KubeError):
    """5xx: the API server failed; worth trying again."""


class LeaseConflictError(ConflictError):
    """Someone else wrote the Lease first: read it again."""


_BY_STATUS: dict[int, type[KubeError]] = {
    400: BadRequestError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
    422: UnprocessableError,
    429: TooManyRequestsError,
}


def error_for(status: int, message: str, *, causes: Sequence[str] = ()) -> KubeError:
    """The exception for an answer with HTTP ``status``."""
    kind = _BY_STATUS.get(status) or (ServerError if status >= 500 else KubeError)
    return kind(message, status=status, causes=causes)


def wrap(exc: BaseException, what: str) -> KubeError:
    """``exc`` as a typed error saying what was being done (the API server's message kept)."""
    if isinstance(exc, KubeError):
        return exc
    if isinstance(exc, ApiError):
        details = exc.status.details
        causes = (
            [str(c.field or c.message or "") for c in (details.causes or [])] if details else []
        )
        return error_for(
            int(exc.status.code or 0), f"{what}: {exc.status.message or exc}", causes=causes
        )
    if isinstance(exc, (httpx2.TransportError, OSError)):
        return UnreachableError(f"{what}: {type(exc).__name__}: {exc}")
    return KubeError(f"{what}: {type(exc).__name__}: {exc}")


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Run the block, raising any failure as a typed :class:`KubeError` about ``what``."""
    try:
        yield
    except KubeError:
        raise
    except Exception as exc:
        raise wrap(exc, what) from exc
