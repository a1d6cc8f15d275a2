"""Certificates the controller keeps in Secrets (gpushare.cluster.certificates), against Secrets
kept in memory the way the API server keeps them (create conflicts, resourceVersion). The same
on the local cluster with the chart: tests/cluster/test_chart_certificates.py."""

import asyncio
import datetime as dt
import socket
import ssl
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.cluster.certificates import (
    CREDENTIALS_ANNOTATION,
    RESTARTED_AT,
    CertificateKeeper,
    CertificateSettings,
    leaves_for,
)
from gpushare.cluster.issuing import RENEW_ANNOTATION
from gpushare.cluster.settings import parse_args
from gpushare.cluster.tls import ReloadingServerTls, issued_by_one_of
from tests.fixtures.secret_store import NS, PREFIX, Secrets

EXTENDER_HOSTS = ("gpushare-controller-extender.gpushare-system.svc", "10.96.88.88")


def replica(
    store: Secrets, work: Path, clock: list[dt.datetime], *, restart: str = "gpushare-scheduler"
) -> CertificateKeeper:
    settings = CertificateSettings(
        secrets=f"{NS}/{PREFIX}",
        extender_hosts=EXTENDER_HOSTS,
        days=365,
        restart_deployment=restart,
    )
    leaves = leaves_for(
        settings,
        webhook_hosts=["gpushare-controller.gpushare-system.svc", "localhost"],
        webhook_dir=work / "webhook",
        extender_cert=work / "extender" / "tls.crt",
        extender_key=work / "extender" / "tls.key",
        extender_client_ca=work / "extender" / "ca.crt",
    )
    return CertificateKeeper(store, settings, leaves, clock=lambda: clock[0])  # type: ignore[arg-type]


def handshake(server: Path, ca_pem: bytes, client: Mapping[str, bytes], host: str) -> str:
    """The extender's listener (server files) and gpushare-scheduler calling it with its CA
    file and client certificate, as kube-scheduler's extender tlsConfig does."""
    ctx = ReloadingServerTls(
        cert=server / "tls.crt", key=server / "tls.key", client_ca=server / "ca.crt"
    ).context
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with ctx.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"ok")
        except (ssl.SSLError, OSError):
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    work = Path(tempfile.mkdtemp(prefix="gs-client-"))
    (work / "c.crt").write_bytes(client["tls.crt"])
    (work / "c.key").write_bytes(client["tls.key"])
    context = ssl.create_default_context(cadata=ca_pem.decode())
    context.load_cert_chain(work / "c.crt", work / "c.key")
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            return tls.recv(2).decode()
    finally:
        listener.close()
        thread.join(5)


def test_two_replicas_starting_at_once_agree_on_one_ca(tmp_path: Path) -> None:
    store = Secrets()
    clock = [dt.datetime.now(dt.UTC)]
    a, b = replica(store, tmp_path / "a", clock), replica(store, tmp_path / "b", clock)

    async def both() -> None:
        await asyncio.gather(a.start(), b.start())

    asyncio.run(both())
    assert sorted(store.items) == [
        f"{PREFIX}-ca",
        f"{PREFIX}-extender-client",
        f"{PREFIX}-extender-tls",
        f"{PREFIX}-webhook-tls",
    ]
    ca = store.items[f"{PREFIX}-ca"].data["tls.crt"]
    for name in ("extender-client", "extender-tls", "webhook-tls"):
        leaf = store.items[f"{PREFIX}-{name}"].data
        assert leaf["ca.crt"] == ca and issued_by_one_of(leaf["tls.crt"], ca)
    # Both replicas serve the same files, so either can answer the API server or the scheduler.
    for part in ("webhook/tls.crt", "extender/tls.crt", "extender/ca.crt"):
        assert (tmp_path / "a" / part).read_bytes() == (tmp_path / "b" / part).read_bytes()
    client = store.items[f"{PREFIX}-extender-client"].data
    for host in EXTENDER_HOSTS:
        assert handshake(tmp_path / "a" / "extender", ca, client, host) == "ok"


def test_renewal_keeps_the_ca_and_restarts_the_scheduler_only_then(tmp_path: Path) -> None:
    store = Secrets()
    clock = [dt.datetime.now(dt.UTC)]
    keeper = replica(store, tmp_path, clock)
    asyncio.run(keeper.start())
    old_ca = store.items[f"{PREFIX}-extender-tls"].data["ca.crt"]
    old_client = store.items[f"{PREFIX}-extender-client"].data
    asyncio.run(keeper.lead())
    # Its first pods could not start before the Secrets existed: recorded, not restarted.
    assert store.patches == [] and store.annotations["gpushare-scheduler"]
    asyncio.run(keeper.lead())
    assert store.patches == [], "nothing changed: no restart"
    served = (tmp_path / "extender" / "tls.crt").read_bytes()

    for name in ("extender-tls", "extender-client", "webhook-tls"):
        store.annotate(f"{PREFIX}-{name}", RENEW_ANNOTATION)
    asyncio.run(keeper.lead())
    asyncio.run(keeper.sync())
    assert keeper.renewed == 3
    assert (tmp_path / "extender" / "tls.crt").read_bytes() != served
    assert store.items[f"{PREFIX}-extender-tls"].data["ca.crt"] == old_ca
    assert not store.items[f"{PREFIX}-extender-tls"].annotations
    # The running scheduler (old CA file, old client certificate) still reaches the renewed
    # extender; its replacement with the new client certificate too.
    assert handshake(tmp_path / "extender", old_ca, old_client, EXTENDER_HOSTS[0]) == "ok"
    new_client = store.items[f"{PREFIX}-extender-client"].data
    assert handshake(tmp_path / "extender", old_ca, new_client, EXTENDER_HOSTS[0]) == "ok"
    assert len(store.patches) == 1
    # As kubectl rollout restart does; a gpushare.io/ key would make the webhook take the
    # scheduler's pods for gpushare pods and refuse them.
    assert list(store.templates["gpushare-scheduler"]) == [RESTARTED_AT]
    assert store.annotations["gpushare-scheduler"][CREDENTIALS_ANNOTATION]


def test_certificates_are_renewed_with_a_third_of_their_life_left(tmp_path: Path) -> None:
    store = Secrets()
    clock = [dt.datetime.now(dt.UTC)]
    keeper = replica(store, tmp_path, clock)
    asyncio.run(keeper.start())
    asyncio.run(keeper.lead())
    clock[0] += dt.timedelta(days=230)
    asyncio.run(keeper.lead())
    assert keeper.renewed == 0
    clock[0] += dt.timedelta(days=15)  # 120 of 365 days left
    asyncio.run(keeper.lead())
    assert keeper.renewed == 3


def test_a_standby_only_copies_what_the_leader_renewed(tmp_path: Path) -> None:
    store = Secrets()
    clock = [dt.datetime.now(dt.UTC)]
    leader, standby = replica(store, tmp_path / "a", clock), replica(store, tmp_path / "b", clock)
    asyncio.run(leader.start())
    asyncio.run(standby.start())
    store.annotate(f"{PREFIX}-webhook-tls", RENEW_ANNOTATION)
    asyncio.run(standby.sync())
    assert store.items[f"{PREFIX}-webhook-tls"].annotations, "a standby renews nothing"
    asyncio.run(leader.lead())
    assert asyncio.run(standby.sync())
    assert (tmp_path / "b" / "webhook" / "tls.crt").read_bytes() == store.items[
        f"{PREFIX}-webhook-tls"
    ].data["tls.crt"]


def test_with_cert_manager_it_only_restarts_the_scheduler(tmp_path: Path) -> None:
    """cert-manager renews the client certificate; kube-scheduler would keep the old one."""
    store = Secrets()
    clock = [dt.datetime.now(dt.UTC)]
    made = replica(store, tmp_path / "made", clock, restart="")
    asyncio.run(made.start())  # stands in for cert-manager and its Secrets
    settings = CertificateSettings(
        secrets=f"{NS}/{PREFIX}", issue=False, restart_deployment="gpushare-scheduler"
    )
    reader = CertificateKeeper(store, settings, [], clock=lambda: clock[0])  # type: ignore[arg-type]
    before = dict(store.items)
    asyncio.run(reader.start())
    asyncio.run(reader.lead())
    assert store.items == before and store.patches == []
    store.annotate(f"{PREFIX}-extender-client", RENEW_ANNOTATION)
    asyncio.run(made.lead())  # "cert-manager renewed it"
    asyncio.run(reader.lead())
    assert len(store.patches) == 1


def test_flags() -> None:
    settings = parse_args(
        [
            "--certificate-secrets",
            f"{NS}/{PREFIX}",
            "--extender-tls-host",
            "a.svc",
            "--extender-tls-host",
            "10.0.0.1",
            "--extender-tls-cert",
            "/nonexistent/tls.crt",
            "--extender-tls-key",
            "/nonexistent/tls.key",
            "--restart-on-certificate-change",
            "gpushare-scheduler",
        ]
    )
    assert settings.certificates.extender_hosts == ("a.svc", "10.0.0.1")
    assert settings.certificates.namespace == NS and settings.certificates.prefix == PREFIX
    with pytest.raises(InvalidInputError, match="NAMESPACE/PREFIX"):
        parse_args(["--certificate-secrets", "nonamespace"])
    with pytest.raises(InvalidInputError, match="certificate-secrets"):
        parse_args(["--restart-on-certificate-change", "x"])
