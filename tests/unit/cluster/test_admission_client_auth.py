"""Forged reviews cannot read other namespaces' GpuShares once the webhook knows the API
server's client certificate (issue 67: about 1,000 probes a second read a share's size,
memory, class and opt-in from the patch). With ``--webhook-client-ca`` the admission process
answers /mutate and /validate only to a caller presenting a certificate that CA signed; the
probes stay open (the kubelet presents none)."""

import datetime as dt
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpushare.cluster.context import ControllerContext
from gpushare.cluster.issuing import Leaf, issue, make_ca
from gpushare.cluster.metrics import Metrics
from gpushare.cluster.settings import Settings
from gpushare.cluster.state.view import ClusterView
from gpushare.cluster.tls import ensure_certs
from tests.fixtures.admission import ServedAdmission, read_all
from tests.fixtures.builders import pod_json
from tests.unit.cluster.webhook.test_webhook_review import review_body

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServedAdmission, Path]]:
    here = tmp_path_factory.mktemp("tls")
    served_certs = ensure_certs(here / "serving", hosts=["127.0.0.1"])
    clients = make_ca(now=NOW)
    (here / "client-ca.crt").write_bytes(clients["tls.crt"])
    apiserver = issue(clients, Leaf("s", "kube-apiserver"), now=NOW, days=1)
    (here / "apiserver.crt").write_bytes(apiserver["tls.crt"])
    (here / "apiserver.key").write_bytes(apiserver["tls.key"])
    view = ClusterView()
    view.replace_pods([])
    view.mark_synced()
    ctx = ControllerContext(settings=Settings(), view=view, metrics=Metrics(view), kube=None)
    served = ServedAdmission(
        ctx, cert=served_certs.cert, key=served_certs.key, client_ca=here / "client-ca.crt"
    )
    yield served, here
    served.close()


def _request(served: ServedAdmission, path: str, body: bytes, *, cert_dir: Path | None) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if cert_dir is not None:
        context.load_cert_chain(cert_dir / "apiserver.crt", cert_dir / "apiserver.key")
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=10)
    with context.wrap_socket(sock) as s:
        method = "POST" if body else "GET"
        s.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        return read_all(s)


def test_a_review_without_the_api_servers_certificate_gets_no_answer(
    setup: tuple[ServedAdmission, Path],
) -> None:
    served, certs = setup
    body = review_body(pod_json("p", fraction="0.5"))
    forged = _request(served, "/mutate", body, cert_dir=None)
    assert forged.startswith(b"HTTP/1.1 403") and b"--webhook-client-ca" in forged
    assert b"patch" not in forged
    real = _request(served, "/mutate", body, cert_dir=certs)
    assert real.startswith(b"HTTP/1.1 200") and b'"allowed": true' in real
    probe = _request(served, "/healthz", b"", cert_dir=None)
    assert probe.startswith(b"HTTP/1.1 200")
