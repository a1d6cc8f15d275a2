"""The controller's HTTP servers are bounded and /metrics is not a tenant-readable directory
(issue #45): at most MAX_CONNECTIONS open connections, idle or slowly sent ones closed, every
request answered within its deadline, and /metrics answered only to callers ``authorize``
admits (gpushare.kube.access; the real API server: tests/faults/test_security_cluster.py)."""

import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from gpushare.cluster import server
from gpushare.cluster.admission.child import LIMITS
from gpushare.cluster.context import ControllerContext
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.lean_http import Limits, Routes
from gpushare.cluster.metrics import Metrics
from gpushare.cluster.server import extender_routes
from gpushare.cluster.settings import Settings
from gpushare.cluster.state.view import ClusterView
from gpushare.kube.access import Access
from tests.fixtures.admission import ServedAdmission
from tests.fixtures.builders import gpu, node_json
from tests.fixtures.threaded_listener import ThreadedListener

TOKEN = "Bearer scraper-token"


async def authorize(header: str | None, path: str, *, client: str = "") -> Access:
    if header is None:
        return Access(401, f"{path} needs a bearer token")
    return Access(200, "ok") if header == TOKEN else Access(403, f"{path}: not you")


class Served(ThreadedListener):
    """A :class:`Listener` on a loopback port, with the extender's limits changed by
    ``bounds``."""

    def __init__(self, app: Routes, **bounds: Any) -> None:
        super().__init__(app, Limits(**{**vars(server.EXTENDER_LIMITS), **bounds}))

    def get(self, path: str, *, headers: str = "") -> bytes:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(
                f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n".encode()
            )
            return _read_all(s)


def _read_all(s: socket.socket) -> bytes:
    """Everything the server sent before it closed (a reset is a close: the server closed a
    connection with our bytes unread)."""
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def _view() -> ClusterView:
    view = ClusterView()
    view.replace_nodes([node_json("n1", [gpu("G0")])])
    view.replace_pods([])
    return view


@pytest.fixture
def extender() -> Iterator[Served]:
    view = _view()
    routes = extender_routes(
        Extender(view=view, writer=None),
        metrics=Metrics(view),
        ready=lambda: (True, ""),
        authorize=authorize,
    )
    # The total bound alone (the per-client one: test_lean_http, test_admission_flood).
    served = Served(routes, max_connections=3, idle_timeout_s=0.5, per_client_connections=0)
    yield served
    served.close()


def test_metrics_answer_only_a_caller_the_api_server_vouches_for(extender: Served) -> None:
    anonymous = extender.get("/metrics")
    assert anonymous.startswith(b"HTTP/1.1 401") and b"WWW-Authenticate: Bearer" in anonymous
    assert b"needs a bearer token" in anonymous and b"gpushare_controller_gpus" not in anonymous
    tenant = extender.get("/metrics", headers="Authorization: Bearer tenant\r\n")
    assert tenant.startswith(b"HTTP/1.1 403") and b"gpushare_" not in tenant.split(b"\r\n\r\n")[1]
    scraper = extender.get("/metrics", headers=f"Authorization: {TOKEN}\r\n")
    assert scraper.startswith(b"HTTP/1.1 200") and b"gpushare_controller_gpus" in scraper
    assert extender.get("/healthz").startswith(b"HTTP/1.1 200")  # the kubelet's probes: open


def test_connections_beyond_the_bound_are_closed_and_idle_ones_do_not_hold_the_server(
    extender: Served,
) -> None:
    """Issue #45: the node agent's server held a thread per idle connection without a timeout.
    Here three idle connections fill the bound; a fourth is closed at once; within the idle
    timeout the three are closed and the server answers again."""
    idle = [socket.create_connection(("127.0.0.1", extender.port), timeout=5) for _ in range(3)]
    time.sleep(0.1)
    with socket.create_connection(("127.0.0.1", extender.port), timeout=5) as extra:
        extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_all(extra) == b""  # closed, unanswered
    slow = idle[0]
    slow.sendall(b"GET /healthz HTTP/1.1\r\nHo")  # a header sent a byte at a time: also idle
    started = time.monotonic()
    for s in idle:
        assert _read_all(s) == b""
        s.close()
    assert time.monotonic() - started < 3
    assert extender.get("/healthz").startswith(b"HTTP/1.1 200")


def test_a_review_whose_body_never_finishes_is_cut_at_its_deadline() -> None:
    ctx = ControllerContext(settings=Settings(), view=_view(), metrics=Metrics(_view()), kube=None)
    served = ServedAdmission(ctx, limits=replace(LIMITS, body_deadline_s=0.5))
    try:
        with served.connect() as s:
            s.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
            started = time.monotonic()
            answer = s.recv(65536)
            assert answer.startswith(b"HTTP/1.1 503") and b"no answer within" in answer
            assert time.monotonic() - started < 3
    finally:
        served.close()


def test_one_client_holding_connections_does_not_shut_kube_scheduler_out() -> None:
    """Issue 67: one pod could hold every one of the extender's 256 connections (nothing but
    the total bound). Now one address holds at most 64; kube-scheduler's (another address)
    are served."""
    view = _view()
    routes = extender_routes(
        Extender(view=view, writer=None), metrics=Metrics(view), ready=lambda: (True, "")
    )
    served = Served(routes, idle_timeout_s=30.0)
    held = []
    try:
        for _ in range(300):
            held.append(
                socket.create_connection(
                    ("127.0.0.1", served.port), timeout=5, source_address=("127.0.0.2", 0)
                )
            )
        time.sleep(0.3)
        assert served.get("/healthz").startswith(b"HTTP/1.1 200")
    finally:
        for s in held:
            s.close()
        served.close()
