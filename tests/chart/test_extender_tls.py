"""gpushare-scheduler calls the extender over HTTPS and checks it against the controller's CA;
two renders of the chart are the same bytes (no certificate in them)."""

import asyncio
import socket
import ssl
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.cluster.certificates import CertificateKeeper, leaves_for
from gpushare.cluster.settings import parse_args
from gpushare.cluster.tls import ReloadingServerTls
from tests.chart.controller_flags import parseable
from tests.fixtures.helm_chart import LOCAL_VALUES, Chart, container
from tests.fixtures.secret_store import Secrets

SECRET = "gpushare-controller-extender-tls"
CLIENT_SECRET = "gpushare-controller-extender-client"


def _scheduler_extender(rendered: Any) -> dict[str, Any]:
    config = yaml.safe_load(rendered.get("ConfigMap", "gpushare-scheduler")["data"]["config.yaml"])
    (extender,) = config["extenders"]
    return dict(extender)


def _handshake(
    ca_pem: bytes,
    cert_pem: bytes,
    key_pem: bytes,
    host: str,
    *,
    client: dict[str, bytes] | None = None,
    client_ca: bytes | None = None,
) -> str:
    """Serve TLS with the certificate (asking for a client certificate signed by
    ``client_ca`` when given, as the controller does), connect as the scheduler would (CA, host
    name, ``client`` certificate); returns what the server sent."""
    work = Path(tempfile.mkdtemp(prefix="gs-tls-"))
    (work / "tls.crt").write_bytes(cert_pem)
    (work / "tls.key").write_bytes(key_pem)
    if client_ca is not None:
        (work / "client-ca.crt").write_bytes(client_ca)
    server_ctx = ReloadingServerTls(
        cert=work / "tls.crt",
        key=work / "tls.key",
        client_ca=work / "client-ca.crt" if client_ca is not None else None,
    ).context
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"ok")
        except (ssl.SSLError, OSError):
            conn.close()  # the client refused the certificate

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    context = ssl.create_default_context(cadata=ca_pem.decode())
    if client is not None:
        (work / "client.crt").write_bytes(client["tls.crt"])
        (work / "client.key").write_bytes(client["tls.key"])
        context.load_cert_chain(work / "client.crt", work / "client.key")
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            return tls.recv(2).decode()
    finally:
        listener.close()
        thread.join(5)


def issued(rendered: Any) -> dict[str, dict[str, bytes]]:
    """The Secrets the rendered controller makes when it starts: its own flags parsed by its
    own parser, its certificate keeper run against Secrets kept in memory."""
    args = container(rendered.get("Deployment", "gpushare-controller"), "controller")["args"]
    settings = parse_args(parseable(args, rendered))
    work = Path(tempfile.mkdtemp(prefix="gs-issued-"))
    store = Secrets()
    keeper = CertificateKeeper(
        store,  # type: ignore[arg-type]
        settings.certificates,
        leaves_for(
            settings.certificates,
            webhook_hosts=settings.webhook_hosts(),
            webhook_dir=work / "webhook",
            extender_cert=work / "extender" / "tls.crt",
            extender_key=work / "extender" / "tls.key",
            extender_client_ca=work / "extender" / "ca.crt",
        ),
    )
    asyncio.run(keeper.start())
    return {name: dict(secret.data) for name, secret in store.items.items()}


def test_scheduler_trusts_the_certificate_the_controller_serves(chart: Chart) -> None:
    rendered = chart.render(values_files=[LOCAL_VALUES])
    secrets = issued(rendered)
    data = secrets[SECRET]
    extender = _scheduler_extender(rendered)
    assert extender["urlPrefix"] == "https://10.96.88.88:8888/scheduler"
    assert extender["enableHTTPS"] is True
    # The scheduler mounts the extender's CA only (no server key), and its client certificate.
    sched = rendered.get("Deployment", "gpushare-scheduler")["spec"]["template"]["spec"]
    (volume,) = [v for v in sched["volumes"] if v["name"] == "extender-ca"]
    assert volume["secret"] == {
        "secretName": SECRET,
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    (own,) = [v for v in sched["volumes"] if v["name"] == "extender-client"]
    assert own["secret"]["secretName"] == CLIENT_SECRET
    mounts = {
        m["name"]: m["mountPath"]
        for m in container(rendered.get("Deployment", "gpushare-scheduler"), "kube-scheduler")[
            "volumeMounts"
        ]
    }
    assert extender["tlsConfig"] == {
        "caFile": f"{mounts['extender-ca']}/ca.crt",
        "certFile": f"{mounts['extender-client']}/tls.crt",
        "keyFile": f"{mounts['extender-client']}/tls.key",
    }
    client = secrets[CLIENT_SECRET]
    # Checked the way kube-scheduler checks it: the pinned IP (no cluster DNS) and the DNS
    # names; and the extender checks the scheduler's client certificate the way it will.
    for host in ("10.96.88.88", "gpushare-controller-extender.gpushare-system.svc"):
        answer = _handshake(
            data["ca.crt"],
            data["tls.crt"],
            data["tls.key"],
            host,
            client=client,
            client_ca=data["ca.crt"],
        )
        assert answer == "ok"


def test_the_extender_refuses_clients_without_the_schedulers_certificate(chart: Chart) -> None:
    """Mutual TLS: a pod that can reach the extender but holds no certificate from the
    controller's CA gets no answer (issue: any pod could POST /scheduler/bind)."""
    rendered = chart.render()
    data = issued(rendered)[SECRET]
    other = issued(rendered)[CLIENT_SECRET]  # another CA, as a tenant could make one
    host = "gpushare-controller-extender.gpushare-system.svc"
    for client in (None, other):
        try:
            answer = _handshake(
                data["ca.crt"],
                data["tls.crt"],
                data["tls.key"],
                host,
                client=client,
                client_ca=data["ca.crt"],
            )
        except (ssl.SSLError, OSError):
            continue
        assert answer != "ok", f"the extender answered a client with {client and 'a foreign'} cert"
    settings = parse_args(
        parseable(
            container(rendered.get("Deployment", "gpushare-controller"), "controller")["args"],
            rendered,
        )
    )
    assert settings.extender_client_ca is not None


def test_the_controller_writes_the_extender_files_it_serves(chart: Chart) -> None:
    rendered = chart.render()
    deploy = rendered.get("Deployment", "gpushare-controller")
    c = container(deploy, "controller")
    settings = parse_args(parseable(c["args"], rendered))
    assert settings.extender_tls_cert is not None and settings.extender_tls_key is not None
    assert settings.certificates.issue
    assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert c["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    volumes = {v["name"]: v for v in deploy["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    # Written from the Secrets it keeps into memory-backed directories of its own.
    for name in ("extender-tls", "webhook-certs"):
        assert volumes[name]["emptyDir"]["medium"] == "Memory"
        assert not mounts[name]["readOnly"]
    assert str(settings.extender_tls_cert).startswith(mounts["extender-tls"]["mountPath"])
    assert str(settings.webhook_cert_dir) == mounts["webhook-certs"]["mountPath"]


def test_a_certificate_from_another_ca_is_refused(chart: Chart) -> None:
    """The CA is the controller's own: a certificate of another installation fails."""
    a = issued(chart.render())[SECRET]
    b = issued(chart.render())[SECRET]
    try:
        _handshake(
            a["ca.crt"], b["tls.crt"], b["tls.key"], "gpushare-controller.gpushare-system.svc"
        )
    except ssl.SSLError as exc:
        assert "certificate verify failed" in str(exc)
    else:
        raise AssertionError("a certificate from another CA was trusted")


def test_cert_manager_issues_it_from_the_webhook_issuer(chart: Chart) -> None:
    rendered = chart.render(
        {
            "webhook": {"certManager": {"enabled": True}},
            "controller": {"service": {"clusterIP": "10.96.88.88"}},
        }
    )
    cert = rendered.get("Certificate", "gpushare-controller-extender")
    assert cert["spec"]["secretName"] == SECRET
    assert cert["spec"]["ipAddresses"] == ["10.96.88.88"]
    assert "gpushare-controller-extender.gpushare-system.svc" in cert["spec"]["dnsNames"]
    assert cert["spec"]["issuerRef"] == {"name": "gpushare-controller-ca", "kind": "Issuer"}
    assert not [s for s in rendered.all("Secret") if s["metadata"]["name"] == SECRET]


def test_plain_http_when_turned_off(chart: Chart) -> None:
    rendered = chart.render({"controller": {"extender": {"tls": {"enabled": False}}}})
    extender = _scheduler_extender(rendered)
    assert extender["urlPrefix"].startswith("http://") and "tlsConfig" not in extender
    args = container(rendered.get("Deployment", "gpushare-controller"), "controller")["args"]
    assert not [a for a in args if a.startswith("--extender-tls")]
    assert not [s for s in rendered.all("Secret") if s["metadata"]["name"] == SECRET]


@pytest.mark.parametrize("kube_version", [None, "1.34.4"])
@pytest.mark.parametrize(
    "values",
    [{}, {"webhook": {"certManager": {"enabled": True}}}],
    ids=["default", "cert-manager"],
)
def test_two_renders_are_byte_identical(
    chart: Chart, kube_version: str | None, values: dict[str, Any]
) -> None:
    """What a GitOps tool (Argo CD renders with `helm template`, no `lookup`) needs to see
    the release in sync: the same values render the same bytes, by default too (the controller
    makes its certificates at run time; docs/chart.md, "GitOps")."""
    first = chart.text(values, kube_version=kube_version)
    assert chart.text(values, kube_version=kube_version) == first
    assert "kind: Secret" not in first
