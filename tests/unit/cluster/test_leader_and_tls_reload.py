"""Leader election between controller replicas, and certificates reloaded on rotation. The
real failover (two controller processes, a real Lease, a 200-pod burst) is
tests/faults/test_security_cluster.py; these check the rules on a Lease kept in memory the way
the API server keeps it (resourceVersion, 409 on a stale write)."""

import asyncio
import copy
import datetime as dt
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest

from gpushare.cluster.leader import LeaderElector, LeadershipLostError
from gpushare.cluster.tls import ReloadingServerTls, ensure_certs
from gpushare.kube.errors import LeaseConflictError


class LeaseStore:
    """The Lease calls with the API server's optimistic concurrency."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.down = False

    async def get_lease(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        if self.down:
            raise OSError("API server unreachable")
        return copy.deepcopy(self.lease)

    async def create_lease(
        self, *, namespace: str, name: str, spec: dict[str, Any]
    ) -> dict[str, Any]:
        if self.lease is not None:
            raise LeaseConflictError("exists")
        self.version += 1
        self.lease = {"metadata": {"resourceVersion": str(self.version)}, "spec": dict(spec)}
        return copy.deepcopy(self.lease)

    async def replace_lease(
        self, *, namespace: str, name: str, lease: dict[str, Any]
    ) -> dict[str, Any]:
        if self.down:
            raise OSError("API server unreachable")
        assert self.lease is not None
        if lease["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
            raise LeaseConflictError("stale")
        self.version += 1
        self.lease = {"metadata": {"resourceVersion": str(self.version)}, "spec": lease["spec"]}
        return copy.deepcopy(self.lease)


def electors(store: LeaseStore, now: list[float]) -> tuple[LeaderElector, LeaderElector]:
    return tuple(  # type: ignore[return-value]
        LeaderElector(
            store,
            namespace="ns",
            name="gpushare-controller",
            identity=who,
            lease_seconds=8,
            renew_seconds=2,
            clock=lambda: now[0],
        )
        for who in ("a", "b")
    )


def test_one_leader_and_a_standby_takes_over_only_after_the_lease_runs_out() -> None:
    store, now = LeaseStore(), [0.0]
    a, b = electors(store, now)

    async def scenario() -> None:
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
        now[0] = 6
        assert not await b.try_acquire_or_renew()  # b saw the lease at 0: 8 s not over
        now[0] = 7
        assert await a.try_acquire_or_renew()  # a renews; then dies
        now[0] = 8
        assert not await b.try_acquire_or_renew()  # b sees the renewal now (its own clock)
        now[0] = 15.5
        assert not await b.try_acquire_or_renew()  # 7.5 s since b saw it: not over
        now[0] = 16.5  # a lease and one poll after a's last renewal
        assert await b.try_acquire_or_renew()
        assert store.lease is not None
        assert store.lease["spec"]["holderIdentity"] == "b"
        assert store.lease["spec"]["leaseTransitions"] == 1

    asyncio.run(scenario())


def test_a_leader_that_sees_another_holder_stops_at_once() -> None:
    store, now = LeaseStore(), [0.0]
    a, _ = electors(store, now)

    async def scenario() -> None:
        stopping = asyncio.Event()
        assert await a.acquire(stopping)
        assert store.lease is not None
        store.lease["spec"]["holderIdentity"] = "b"  # b took it while a was partitioned
        store.version += 1
        store.lease["metadata"]["resourceVersion"] = str(store.version)
        with pytest.raises(LeadershipLostError, match="taken by b"):
            await asyncio.wait_for(_fast_keep(a, stopping), timeout=10)

    asyncio.run(scenario())


def test_a_leader_cut_off_from_the_api_server_stops_before_its_lease_runs_out() -> None:
    store, now = LeaseStore(), [0.0]
    a, _ = electors(store, now)

    async def scenario() -> None:
        stopping = asyncio.Event()
        assert await a.acquire(stopping)
        store.down = True
        now[0] = 9  # longer than the lease since the last renewal
        with pytest.raises(LeadershipLostError, match="not renewed"):
            await asyncio.wait_for(_fast_keep(a, stopping), timeout=10)

    asyncio.run(scenario())


def test_release_lets_the_standby_take_over_at_once() -> None:
    store, now = LeaseStore(), [0.0]
    a, b = electors(store, now)

    async def scenario() -> None:
        assert await a.acquire(asyncio.Event())
        assert not await b.try_acquire_or_renew()
        await a.release()
        assert await b.try_acquire_or_renew()

    asyncio.run(scenario())


def _foreign_lease(store: LeaseStore, **spec: Any) -> None:
    store.version += 1
    store.lease = {
        "metadata": {"resourceVersion": str(store.version)},
        "spec": {"holderIdentity": "mallory", "renewTime": "2026-01-01T00:00:00.000000Z", **spec},
    }


@pytest.mark.parametrize(
    "duration", [10**18, 1e308, float("inf"), "9999999", True, -5, None, [1], {"s": 1}]
)
def test_a_lease_with_an_absurd_duration_delays_a_takeover_by_one_lease_at_most(
    duration: Any,
) -> None:
    """Issue #45: a Lease saying it lasts for ever kept a standby from ever leading. Whatever it
    says, a holder that stops renewing is replaced after this replica's own lease (8 s)."""
    store, now = LeaseStore(), [0.0]
    _, b = electors(store, now)
    _foreign_lease(store, leaseDurationSeconds=duration, leaseTransitions="many")

    async def scenario() -> None:
        assert not await b.try_acquire_or_renew()  # seen now: a lease is honoured
        now[0] = 7.9
        assert not await b.try_acquire_or_renew()
        now[0] = 8.1
        assert await b.try_acquire_or_renew()
        assert store.lease is not None
        assert store.lease["spec"]["holderIdentity"] == "b"
        assert store.lease["spec"]["leaseTransitions"] == 1

    asyncio.run(scenario())


def test_a_short_lease_is_honoured_as_written_and_a_broken_spec_is_taken_over() -> None:
    store, now = LeaseStore(), [0.0]
    _, b = electors(store, now)
    _foreign_lease(store, leaseDurationSeconds=3)

    async def scenario() -> None:
        assert not await b.try_acquire_or_renew()
        now[0] = 3.1
        assert await b.try_acquire_or_renew()
        assert store.lease is not None
        store.lease["spec"] = ["not", "an", "object"]  # a Lease without a readable spec
        store.lease["metadata"]["resourceVersion"] = str(store.version)
        assert await b.try_acquire_or_renew()
        assert store.lease["spec"]["holderIdentity"] == "b"

    asyncio.run(scenario())


async def _fast_keep(elector: LeaderElector, stopping: asyncio.Event) -> None:
    elector.renew_seconds = 0.01
    await elector.keep(stopping)


# ---- certificates reloaded -----------------------------------------------------------------


def _serve_once(context: ssl.SSLContext) -> tuple[int, threading.Thread]:
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        for _ in range(4):
            conn, _ = listener.accept()
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")
            except (ssl.SSLError, OSError):
                conn.close()
        listener.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


def _call(port: int, ca: bytes) -> str:
    context = ssl.create_default_context(cadata=ca.decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        return tls.recv(2).decode()


def test_a_rotated_certificate_is_served_to_new_connections_without_a_restart(
    tmp_path: Path,
) -> None:
    first = ensure_certs(tmp_path / "a", hosts=["localhost"])
    second = ensure_certs(tmp_path / "b", hosts=["localhost"])  # another CA
    live = tmp_path / "live"
    live.mkdir()
    for name in ("tls.crt", "tls.key"):
        (live / name).write_bytes((tmp_path / "a" / name).read_bytes())
    tls = ReloadingServerTls(cert=live / "tls.crt", key=live / "tls.key")
    port, thread = _serve_once(tls.context)
    assert _call(port, first.ca_pem()) == "ok"
    assert not tls.changed()
    (live / "tls.key").write_bytes((tmp_path / "b" / "tls.key").read_bytes())
    assert tls.changed() and not tls.reload()  # half a rotation: the old one stays
    assert _call(port, first.ca_pem()) == "ok"
    (live / "tls.crt").write_bytes((tmp_path / "b" / "tls.crt").read_bytes())
    assert tls.reload() and tls.reloads == 1
    assert _call(port, second.ca_pem()) == "ok"
    with pytest.raises(ssl.SSLError):
        _call(port, first.ca_pem())
    thread.join(5)


def test_validity_window_of_generated_certificates_is_long(tmp_path: Path) -> None:
    files = ensure_certs(tmp_path, hosts=["localhost"])
    from cryptography import x509  # noqa: PLC0415

    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    assert cert.not_valid_after_utc - dt.datetime.now(dt.UTC) > dt.timedelta(days=300)


def test_a_standby_resolves_gpushare_links_from_the_watched_spec() -> None:
    """A standby runs no operator, yet serves the webhook: pods linked to a GpuShare
    (gpushare.io/share) must resolve there too, from the share the controller watches."""
    from gpushare.cluster.main import ControllerContext  # noqa: PLC0415
    from gpushare.cluster.metrics import Metrics  # noqa: PLC0415
    from gpushare.cluster.settings import Settings  # noqa: PLC0415
    from gpushare.cluster.state.view import ClusterView  # noqa: PLC0415

    view = ClusterView()
    view.replace_shares(
        [
            {"metadata": {"name": "infer", "namespace": "team"}, "spec": {"fraction": "0.3"}},
            {"metadata": {"name": "broken", "namespace": "team"}, "spec": {"fraction": "3"}},
        ]
    )
    ctx = ControllerContext(settings=Settings(), view=view, metrics=Metrics(view), kube=None)
    lookup = ctx.cluster_facts().share_lookup
    assert lookup is not None
    found = lookup("team", "infer")
    assert found is not None and found.percent == 30 and found.share == "infer"
    assert lookup("team", "broken") is None and lookup("other", "infer") is None
