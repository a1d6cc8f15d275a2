"""Errors of the Kubernetes layer: one type for a failed API call, one for a lost Lease race."""

from lightkube import ApiError


class KubeError(Exception):
    """An API call that failed; ``status`` is the HTTP status (0 when none came back)."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class LeaseConflictError(Exception):
    """Someone else wrote the Lease first (HTTP 409): read it again."""


def wrap(exc: Exception, what: str) -> KubeError:
    """``exc`` as a KubeError saying what was being done (the API server's message kept)."""
    if isinstance(exc, ApiError):
        code = int(exc.status.code or 0)
        return KubeError(f"{what}: {exc.status.message or exc}", status=code)
    return KubeError(f"{what}: {type(exc).__name__}: {exc}")
