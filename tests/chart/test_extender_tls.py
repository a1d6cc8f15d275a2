"""gpushare-scheduler calls the extender over HTTPS and checks it against the chart's CA."""

import base64
import socket
import ssl
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.cluster.settings import parse_args
from gpushare.cluster.tls import ReloadingServerTls
from tests.chart.controller_flags import parseable
from tests.fixtures.helm_chart import LOCAL_VALUES, Chart, container

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


def test_scheduler_trusts_the_certificate_the_controller_serves(chart: Chart) -> None:
    rendered = chart.render(values_files=[LOCAL_VALUES])
    data = {k: base64.b64decode(v) for k, v in rendered.get("Secret", SECRET)["data"].items()}
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
    client = {
        k: base64.b64decode(v) for k, v in rendered.get("Secret", CLIENT_SECRET)["data"].items()
    }
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
    """Mutual TLS: a pod that can reach the extender but holds no certificate from the chart's
    extender CA gets no answer (issue: any pod could POST /scheduler/bind)."""
    rendered = chart.render()
    data = {k: base64.b64decode(v) for k, v in rendered.get("Secret", SECRET)["data"].items()}
    stranger = chart.render()  # another CA, as a tenant could make one
    other = {
        k: base64.b64decode(v) for k, v in stranger.get("Secret", CLIENT_SECRET)["data"].items()
    }
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


def test_controller_serves_the_extender_with_the_secret(chart: Chart) -> None:
    rendered = chart.render()
    deploy = rendered.get("Deployment", "gpushare-controller")
    c = container(deploy, "controller")
    settings = parse_args(parseable(c["args"], rendered))
    assert settings.extender_tls_cert is not None and settings.extender_tls_key is not None
    assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert c["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    volumes = {v["name"]: v for v in deploy["spec"]["template"]["spec"]["volumes"]}
    assert volumes["extender-tls"]["secret"]["secretName"] == SECRET


def test_a_certificate_for_another_name_is_refused(chart: Chart) -> None:
    """The CA is the chart's own: a certificate the scheduler did not ask for fails."""
    first = chart.render()  # `helm template` makes a new CA each time
    second = chart.render()
    a = {k: base64.b64decode(v) for k, v in first.get("Secret", SECRET)["data"].items()}
    b = {k: base64.b64decode(v) for k, v in second.get("Secret", SECRET)["data"].items()}
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


def _changed(first: str, second: str) -> set[tuple[str, str]]:
    """(kind, name) of every object whose rendered text differs between two renders."""
    docs = [
        {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(text) if d}
        for text in (first, second)
    ]
    assert docs[0].keys() == docs[1].keys()
    return {key for key in docs[0] if docs[0][key] != docs[1][key]}


@pytest.mark.parametrize("kube_version", [None, "1.34.4"])
def test_with_cert_manager_two_renders_are_byte_identical(
    chart: Chart, kube_version: str | None
) -> None:
    """What a GitOps tool (Argo CD renders with `helm template`, no `lookup`) needs to see
    the release in sync: the same values render the same bytes (docs/chart.md, "GitOps")."""
    values = {"webhook": {"certManager": {"enabled": True}}}
    first = chart.text(values, kube_version=kube_version)
    assert "kind: Certificate" in first
    assert chart.text(values, kube_version=kube_version) == first


def test_without_cert_manager_each_render_makes_new_certificates(chart: Chart) -> None:
    """Without a cluster to look the Secrets up in, Helm makes a new CA and certificates on
    every render: the three TLS Secrets, and nothing else, differ (docs/chart.md, "GitOps")."""
    first, second = chart.text(), chart.text()
    assert first != second
    assert _changed(first, second) == {
        ("Secret", "gpushare-controller-webhook-tls"),
        ("Secret", "gpushare-controller-extender-tls"),
        ("Secret", "gpushare-controller-extender-client"),
    }
