"""Lease leader election between controller replicas (coordination.k8s.io/v1 Lease).

One replica holds the Lease and does what must happen once: it serves the scheduler extender
(binds pods), runs the operator and the eviction loop. The others keep their view warm from the
same watches and serve the admission webhook (which only reads), so a takeover starts from a
synced view. Expiry is judged on this replica's own clock, from when it last saw the Lease
change (as client-go does), so clocks of different hosts never need to agree.

A leader that cannot renew within the lease stops leading: the process exits and is restarted
as a standby, so two replicas never bind at once for longer than one lease.

What the Lease says is read like any stored object: a duration is honoured up to this replica's
own ``lease_seconds`` (every replica runs the chart's one setting), and a field of the wrong
type reads as absent, so a Lease written with an absurd or hostile duration delays a takeover
by one lease at most (docs/security.md, "Availability").
"""

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from gpushare.kube.errors import LeaseConflictError

log = logging.getLogger(__name__)


class LeaseApi(Protocol):
    """The three Lease calls (gpushare.kube.controller.Kube implements them)."""

    async def get_lease(self, *, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def create_lease(
        self, *, namespace: str, name: str, spec: dict[str, Any]
    ) -> dict[str, Any]: ...

    async def replace_lease(
        self, *, namespace: str, name: str, lease: dict[str, Any]
    ) -> dict[str, Any]: ...


MAX_IDENTITY_CHARS = 256
"""Longest holder identity compared (pod names are at most 253)."""


def _micro_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Observed:
    holder: str
    renew: str
    at: float
    """time.monotonic() when this replica saw (holder, renew) first."""


class LeaderElector:
    """Acquire, renew and release one Lease for ``identity``."""

    def __init__(
        self,
        api: LeaseApi,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: float,
        renew_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self.clock = clock
        self.leading = False
        self._observed: Observed | None = None
        self._last_renew = -1e18

    def _observe(self, spec: dict[str, Any]) -> Observed:
        holder = _text(spec.get("holderIdentity"))
        renew = _text(spec.get("renewTime"))
        old = self._observed
        if old is None or (old.holder, old.renew) != (holder, renew):
            self._observed = Observed(holder, renew, self.clock())
        assert self._observed is not None
        return self._observed

    def _spec(self, *, transitions: int, acquired: str | None) -> dict[str, Any]:
        now = _micro_time(datetime.now(UTC))
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_seconds)),
            "acquireTime": acquired or now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    def honoured_duration(self, written: object) -> float:
        """How long another holder's Lease keeps this replica waiting: what it says, within
        1 s .. ``lease_seconds``; this replica's own lease when it says nothing usable (a
        string, a boolean, NaN, a negative or an absurd number)."""
        if isinstance(written, bool) or not isinstance(written, int | float):
            return self.lease_seconds
        if not math.isfinite(written) or written <= 0:
            return self.lease_seconds
        return float(min(max(written, 1.0), self.lease_seconds))

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this replica holds the Lease afterwards."""
        lease = await self.api.get_lease(namespace=self.namespace, name=self.name)
        if lease is None:
            try:
                await self.api.create_lease(
                    namespace=self.namespace,
                    name=self.name,
                    spec=self._spec(transitions=0, acquired=None),
                )
            except LeaseConflictError:
                return False
            self._last_renew = self.clock()
            return True
        spec = _spec_of(lease)
        seen = self._observe(spec)
        duration = self.honoured_duration(spec.get("leaseDurationSeconds"))
        mine = seen.holder == self.identity
        if seen.holder and not mine and self.clock() < seen.at + duration:
            return False  # another replica's lease is still running
        transitions = _count(spec.get("leaseTransitions")) + (0 if mine else 1)
        acquired = _text(spec.get("acquireTime")) if mine else None
        lease["spec"] = self._spec(transitions=transitions, acquired=acquired)
        try:
            await self.api.replace_lease(namespace=self.namespace, name=self.name, lease=lease)
        except LeaseConflictError:
            return False
        self._last_renew = self.clock()
        return True

    async def acquire(self, stopping: asyncio.Event) -> bool:
        """Wait until this replica leads (True) or ``stopping`` is set (False)."""
        while not stopping.is_set():
            try:
                if await self.try_acquire_or_renew():
                    self.leading = True
                    log.info("became the leader", extra={"lease": self.name, "id": self.identity})
                    return True
            except Exception as exc:
                log.warning("leader election attempt failed", extra={"error": str(exc)})
            try:
                async with asyncio.timeout(self.renew_seconds):
                    await stopping.wait()
            except TimeoutError:
                pass
        return False

    async def keep(self, stopping: asyncio.Event) -> None:
        """Renew until ``stopping`` (returns) or until the lease is lost or cannot be renewed
        before it runs out (raises LeadershipLostError)."""
        deadline_s = self.lease_seconds - self.renew_seconds
        while not stopping.is_set():
            try:
                async with asyncio.timeout(self.renew_seconds):
                    await stopping.wait()
                return
            except TimeoutError:
                pass
            try:
                renewed = await self.try_acquire_or_renew()
            except Exception as exc:
                log.warning("lease renewal failed", extra={"error": str(exc)})
                renewed = False
            if (
                not renewed
                and self._observed is not None
                and (self._observed.holder not in ("", self.identity))
            ):
                self.leading = False
                raise LeadershipLostError(f"lease {self.name} taken by {self._observed.holder}")
            if not renewed and self.clock() - self._last_renew > deadline_s:
                self.leading = False
                raise LeadershipLostError(
                    f"lease {self.name} not renewed for {deadline_s:.0f}s (API server unreachable?)"
                )

    async def release(self) -> None:
        """Give the Lease up at a clean shutdown, so a standby takes over at once."""
        if not self.leading:
            return
        self.leading = False
        try:
            lease = await self.api.get_lease(namespace=self.namespace, name=self.name)
            if lease is None or _text(_spec_of(lease).get("holderIdentity")) != self.identity:
                return
            spec = _spec_of(lease)
            spec.update(holderIdentity="", leaseDurationSeconds=1)
            lease["spec"] = spec
            await self.api.replace_lease(namespace=self.namespace, name=self.name, lease=lease)
            log.info("released the lease", extra={"lease": self.name})
        except Exception as exc:
            log.warning("could not release the lease", extra={"error": str(exc)})


def _spec_of(lease: dict[str, Any]) -> dict[str, Any]:
    """The Lease's spec as a dict (a copy); empty when it is missing or not an object."""
    spec = lease.get("spec")
    return dict(spec) if isinstance(spec, dict) else {}


def _text(value: object) -> str:
    """A string field of the Lease; "" for any other type, cut at MAX_IDENTITY_CHARS."""
    return value[:MAX_IDENTITY_CHARS] if isinstance(value, str) else ""


def _count(value: object) -> int:
    """``leaseTransitions``: a whole number in 0..2**31-1 (the API's int32), else 0."""
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return min(max(value, 0), 2**31 - 2)


class LeadershipLostError(Exception):
    """This replica stopped leading; the process must stop binding at once."""


OnLeading = Callable[[], Awaitable[None]]
