"""The node agent's HTTP server is bounded and its /metrics and /profile are not a
tenant-readable directory (issue #45: they named every pod on the node to anyone, and the
server held a thread per idle connection without a timeout). ``authorize`` stands in for
gpushare.kube.access (its own tests: tests/unit/kube/test_access.py; the real API server:
tests/faults/test_security_cluster.py)."""

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge

from gpushare.cluster.operator.profiler_client import ProfilerClient
from gpushare.cluster.operator.readings import ProfilerError
from gpushare.kube.access import Access
from gpushare.node.main import build_parser
from gpushare.node.metrics import MetricsServer, Reply

SCRAPER = "Bearer scraper"
OPERATOR = "Bearer operator-audience-token"


def authorize(header: str | None, path: str, *, client: str = "") -> Access:
    if header is None:
        return Access(401, f"{path} needs a bearer token")
    allowed = {"/metrics": SCRAPER, "/profile": OPERATOR}
    return Access(200, "ok") if header == allowed.get(path) else Access(403, f"{path}: not you")


@pytest.fixture
def served() -> Iterator[MetricsServer]:
    registry = CollectorRegistry()
    Gauge(
        "gpushare_pod_gpu_memory_used_bytes", "x", ["namespace", "pod"], registry=registry
    ).labels("victim-ns", "victim").set(1)
    server = MetricsServer(
        registry=registry,
        host="127.0.0.1",
        port=0,
        authorize=authorize,
        max_connections=3,
        idle_timeout_s=0.5,
        deadline_s=1.5,
    )
    server.add_route("/profile", lambda q: Reply(200, "application/json", b'{"pod": "victim"}'))
    server.start()
    yield server
    server.stop()


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


def get(server: MetricsServer, path: str, header: str | None = None) -> bytes:
    auth = f"Authorization: {header}\r\n" if header else ""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
        return _read_all(s)


def test_pods_on_the_node_are_named_only_to_callers_the_api_server_vouches_for(
    served: MetricsServer,
) -> None:
    anonymous = get(served, "/metrics")
    assert anonymous.startswith(b"HTTP/1.0 401") and b"WWW-Authenticate: Bearer" in anonymous
    assert b"victim" not in anonymous and b"needs a bearer token" in anonymous
    tenant = get(served, "/metrics", "Bearer tenant")
    assert tenant.startswith(b"HTTP/1.0 403") and b"victim" not in tenant
    assert b'pod="victim"' in get(served, "/metrics", SCRAPER)
    # /profile takes only the operator's token (its own audience), not a scraper's.
    assert get(served, "/profile", SCRAPER).startswith(b"HTTP/1.0 403")
    assert b"victim" in get(served, "/profile", OPERATOR)
    assert get(served, "/healthz").startswith(b"HTTP/1.0 200")  # the kubelet's probe: open


def test_connections_beyond_the_bound_are_closed_and_slow_ones_are_cut(
    served: MetricsServer,
) -> None:
    idle = [socket.create_connection(("127.0.0.1", served.port), timeout=5) for _ in range(3)]
    time.sleep(0.2)
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as extra:
        extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_all(extra) == b""  # closed, unanswered
    assert served.refused_connections >= 1
    # One sends its request a byte at a time, each within the idle timeout: the deadline cuts it.
    slow = idle.pop()
    started = time.monotonic()
    with pytest.raises(OSError):
        for byte in b"GET /healthz HTTP/1.1\r\nHost: x" * 10:
            slow.sendall(bytes([byte]))
            time.sleep(0.1)
    assert time.monotonic() - started < 4
    for s in idle:  # idle ones: closed by the idle timeout
        assert _read_all(s) == b""
        s.close()
    slow.close()
    assert get(served, "/healthz").startswith(b"HTTP/1.0 200")


def test_the_operator_presents_its_token_file_and_a_refusal_names_the_fix(
    served: MetricsServer, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text(OPERATOR.removeprefix("Bearer ") + "\n")
    url = f"http://127.0.0.1:{served.port}"

    async def fetch(token_file: Path | None) -> str:
        client = ProfilerClient(url_template=url, timeout_s=5, token_file=token_file)
        try:
            await client.fetch(node="n", node_ip=None, gpu_uuid="GPU-0", window_s=1)
        except ProfilerError as exc:
            return str(exc)
        finally:
            await client.close()
        return "answered"

    # The stand-in answer is no profile: past authorization the reading is refused as such.
    with_token = asyncio.run(fetch(token))
    assert "401" not in with_token and "403" not in with_token
    without = asyncio.run(fetch(tmp_path / "missing"))
    assert "answered 401" in without and "needs a bearer token" in without


def test_the_agent_checks_tokens_unless_told_not_to() -> None:
    assert build_parser().parse_args([]).metrics_auth == "tokenreview"
    assert build_parser().parse_args(["--metrics-auth", "none"]).metrics_auth == "none"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--metrics-auth", "maybe"])


def test_a_burst_of_connections_is_taken_without_dropping_any(served: MetricsServer) -> None:
    """200 connections opened at once (a tenant's flood, or many scrapers) are each accepted
    (and beyond the bound closed) at once: with socketserver's backlog of 5, the kernel
    dropped the rest of the burst's SYNs and each waited for a retransmit, 1 s or more, and so
    did a kubelet probe arriving meanwhile."""
    held: list[socket.socket] = []
    slowest = 0.0
    try:
        for _ in range(200):
            start = time.monotonic()
            held.append(socket.create_connection(("127.0.0.1", served.port), timeout=10))
            slowest = max(slowest, time.monotonic() - start)
    finally:
        for s in held:
            s.close()
    assert slowest < 0.9, f"a connect waited {slowest:.2f} s: a dropped SYN's retransmit"


def _hold(port: int, source: str, count: int) -> list[socket.socket]:
    held = []
    for _ in range(count):
        try:
            held.append(
                socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
            )
        except OSError:
            break
    return held


def _probe(port: int, source: str = "127.0.0.1") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0)) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        return _read_all(s)


def test_one_pod_holding_every_connection_no_longer_starves_the_probes() -> None:
    """Issue 67: one pod holding the agent's 64 connections failed its liveness probes 0/9
    (restarted over and over), blinded Prometheus and left the bind check without a verdict.
    Now one client address holds at most PER_CLIENT connections; the kubelet's probes (another
    address) are answered throughout, with the default bounds and a long idle timeout."""
    server = MetricsServer(
        registry=CollectorRegistry(), host="127.0.0.1", port=0, idle_timeout_s=30.0
    )
    server.start()
    held = _hold(server.port, "127.0.0.2", 200)
    try:
        time.sleep(0.3)
        answers = [_probe(server.port) for _ in range(9)]
        assert all(a.startswith(b"HTTP/1.0 200") for a in answers), answers
        assert server.refused_connections >= 200 - 8
    finally:
        for s in held:
            s.close()
        server.stop()


def test_many_clients_filling_the_server_make_room_for_a_new_one() -> None:
    """Over the total, the oldest connection of the client holding the most is cut: a new
    client (the kubelet) gets in even when several pods fill every slot."""
    server = MetricsServer(
        registry=CollectorRegistry(), host="127.0.0.1", port=0, idle_timeout_s=30.0
    )
    server.start()
    held = [s for n in range(2, 10) for s in _hold(server.port, f"127.0.0.{n}", 8)]
    try:
        time.sleep(0.3)
        assert len(held) == 64
        assert _probe(server.port).startswith(b"HTTP/1.0 200")
    finally:
        for s in held:
            s.close()
        server.stop()
