"""The webhook's port is no lever on the controller (issue 67): what one client sends there
(idle connections, unfinished large bodies, a review of millions of values, a body in an
encoding nobody sends) is bounded by the admission process, which owns the port, and another
client's reviews are answered meanwhile. On 6842a8c the webhook shared the controller's loop:
idle connections held by one pod left 1-2 of 60 admissions answered, 64 unfinished 8 MiB
bodies took the controller from 61 to 648 MiB, and one 4-million-integer review held the loop
for over a second."""

import base64
import contextlib
import json
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.names import LABEL_SHARE_SELECTORS
from gpushare.cluster.admission.child import (
    LOOKUPS_PER_CLIENT_S,
    MAX_REVIEW_BYTES,
    MAX_REVIEW_VALUES,
)
from gpushare.cluster.context import ControllerContext
from gpushare.cluster.metrics import Metrics
from gpushare.cluster.settings import Settings
from gpushare.cluster.state.view import ClusterView
from gpushare.cluster.tls import ensure_certs
from tests.fixtures.admission import ServedAdmission, read_all
from tests.fixtures.builders import gpu, node_json, pod_json
from tests.unit.cluster.webhook.test_webhook_review import review_body

ATTACKER = "127.0.0.2"
"""The flooding pod: another client address than the API server's (127.0.0.1)."""


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedAdmission]:
    """The admission process of a controller holding one node, over TLS as in a cluster."""
    certs = ensure_certs(tmp_path_factory.mktemp("certs"), hosts=["127.0.0.1", "localhost"])
    view = ClusterView()
    view.replace_nodes([node_json("n1", [gpu("G0")])])
    view.replace_pods([])
    view.mark_synced()
    ctx = ControllerContext(settings=Settings(), view=view, metrics=Metrics(view), kube=None)
    served = ServedAdmission(ctx, cert=certs.cert, key=certs.key)
    yield served
    served.close()


def _admission(served: ServedAdmission) -> tuple[bool, float]:
    """One review as the API server sends it: (answered with a verdict, seconds)."""
    started = time.monotonic()
    answer = served.request("POST", "/mutate", review_body(pod_json("p", fraction="0.5")))
    return answer.startswith(b"HTTP/1.1 200") and b'"allowed": true' in answer, (
        time.monotonic() - started
    )


def test_idle_connections_of_one_client_leave_every_admission_answered(
    served: ServedAdmission,
) -> None:
    held: list[socket.socket] = []
    try:
        for _ in range(600):  # more than the port's 512 connections
            try:
                held.append(
                    socket.create_connection(
                        ("127.0.0.1", served.port), timeout=5, source_address=(ATTACKER, 0)
                    )
                )
            except OSError:
                break
        time.sleep(0.5)
        open_ones = sum(1 for s in held if _still_open(s))
        assert open_ones <= 64, f"one client holds {open_ones} connections"
        results = [_admission(served) for _ in range(20)]
        assert all(ok for ok, _ in results)
        assert max(seconds for _, seconds in results) < 2.0
    finally:
        for s in held:
            s.close()


def _still_open(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        s.setblocking(True)


def test_unfinished_large_bodies_cost_the_sender_not_the_controller(
    served: ServedAdmission,
) -> None:
    """An 8 MiB body is refused before any of it is read (413); bodies under the cap count
    against the client's budget (16 MiB in flight): the rest are refused at once (503). The
    controller's memory does not move, the admission process's stays bounded, and another
    client's reviews are answered meanwhile (the controller's own process reads none of it:
    test_the_controller_holds_no_connection_of_the_webhook_port)."""
    assert served.process.pid is not None
    child_before = _rss_mib(served.process.pid)
    with served.connect(source=ATTACKER) as s:
        s.sendall(
            f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: {8 * 2**20}\r\n\r\n".encode()
        )
        over = read_all(s)
    assert over.startswith(b"HTTP/1.1 413"), over[:200]
    size = MAX_REVIEW_BYTES - 1024
    held: list[socket.socket] = []
    try:
        for _ in range(64):
            s = served.connect(source=ATTACKER)
            held.append(s)
            head = f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n"
            with contextlib.suppress(OSError):  # refused (503) and closed while it was sent
                s.sendall(head.encode() + b"[" + b"1," * (2**20 // 2))
        time.sleep(1.0)
        pending = 0
        for s in held:
            s.settimeout(0.2)
            try:
                s.recv(200)  # an answer (503) or the close
            except TimeoutError:
                pending += 1  # its body is still being waited for
            except OSError:
                pass
        assert pending <= 4, f"{pending} of 64 unfinished bodies held (budget: 16 MiB)"
        results = [_admission(served) for _ in range(10)]
        assert all(ok for ok, _ in results)
        child_growth = _rss_mib(served.process.pid) - child_before
        assert child_growth < 64, f"the admission process grew {child_growth:.0f} MiB"
    finally:
        for s in held:
            s.close()


def test_a_review_of_millions_of_values_is_refused_before_it_is_parsed(
    served: ServedAdmission,
) -> None:
    ints = b"1," * (MAX_REVIEW_BYTES // 2 - 1024)
    body = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","x":[' + ints + b"1]}"
    assert len(body) < MAX_REVIEW_BYTES
    started = time.monotonic()
    answer = served.request("POST", "/mutate", body, source=ATTACKER)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert f"at most {MAX_REVIEW_VALUES}".encode() in answer
    assert time.monotonic() - started < 2.0
    with served.connect(source=ATTACKER) as s:
        s.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 8000004\r\n\r\n")
        assert read_all(s).startswith(b"HTTP/1.1 413")
    assert _admission(served)[0]


def test_a_body_in_an_undecodable_content_encoding_is_refused_not_an_internal_error(
    served: ServedAdmission,
) -> None:
    """228 of the last fuzz's uncaught inputs: an undecodable Content-Encoding gave 500."""
    for encoding in ("gzip", "deflate", "br", "x-made-up"):
        answer = served.request(
            "POST", "/mutate", b"\x1f\x8bnot gzip", headers=f"Content-Encoding: {encoding}\r\n"
        )
        assert answer.startswith(b"HTTP/1.1 415"), answer[:200]
        assert b"Content-Encoding" in answer


def test_the_controller_holds_no_connection_of_the_webhook_port(
    served: ServedAdmission,
) -> None:
    """Whatever is sent to the webhook's port, the controller's process reads none of it:
    the port is the admission process's."""
    s = served.connect(source=ATTACKER)
    try:
        port = served.port
        inodes = {
            link.readlink().name
            for link in Path("/proc/self/fd").iterdir()
            if link.is_symlink() and link.readlink().name.startswith("socket:")
        }
        listening = _listeners_of(port)
        assert listening and not (listening & inodes)
    finally:
        s.close()


def _listeners_of(port: int) -> set[str]:
    """The socket inodes listening on ``port`` (any process)."""
    out: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                out.add(f"socket:[{fields[9]}]")
    return out


def test_a_pod_linked_to_a_gpushare_gets_its_request_through_the_controller(
    served: ServedAdmission,
) -> None:
    """The admission process asks the controller for the GpuShare (one lookup message) and
    patches the pod with the share's request; a missing share is refused naming it."""
    share = {
        "apiVersion": "gpushare.io/v1alpha1",
        "kind": "GpuShare",
        "metadata": {"name": "train", "namespace": "default", "uid": "s-1"},
        "spec": {"fraction": "0.25"},
    }
    served.loop.call_soon_threadsafe(served.ctx.view.upsert_share, share)
    time.sleep(0.2)
    pod = pod_json("p", annotations={"gpushare.io/share": "train"})
    answer = served.request("POST", "/mutate", review_body(pod))
    assert b'"allowed": true' in answer, answer[-400:]
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    patch = base64.b64decode(body["response"]["patch"])
    assert b'"25"' in patch
    missing = pod_json("q", annotations={"gpushare.io/share": "nope"})
    refused = served.request("POST", "/mutate", review_body(missing))
    assert b'"allowed": false' in refused and b"no GpuShare 'nope'" in refused


def test_a_share_created_right_after_a_review_links_the_next_pod(
    served: ServedAdmission,
) -> None:
    """The answers the admission process keeps (LOOKUP_TTL_S) are forgotten as soon as a
    GpuShare changes: docs/operator.md's pod created the moment after a second share was
    admitted on the first share's answer, kept from the review just before (issue 68)."""
    namespace = "default"  # the namespace review_body names
    view = served.ctx.view
    labelled = {"metadata": {"name": namespace, "labels": {LABEL_SHARE_SELECTORS: "enabled"}}}
    served.loop.call_soon_threadsafe(view.upsert_namespace, labelled)

    def share(name: str) -> dict[str, Any]:
        return {
            "apiVersion": "gpushare.io/v1alpha1",
            "kind": "GpuShare",
            "metadata": {"name": name, "namespace": namespace, "uid": f"u-{name}"},
            "spec": {"fraction": "0.25", "selector": {"matchLabels": {"app": "x"}}},
        }

    served.loop.call_soon_threadsafe(view.upsert_share, share("first"))
    time.sleep(0.3)

    def review(name: str) -> bytes:
        pod = pod_json(name, namespace=namespace)
        pod["metadata"]["labels"] = {"app": "x"}
        return served.request("POST", "/mutate", review_body(pod))

    assert b'"allowed": true' in review("p0")  # linked to the one share: its answer is kept
    served.loop.call_soon_threadsafe(view.upsert_share, share("second"))
    time.sleep(0.15)  # the watch event and FORGET_CHECK_S; less than LOOKUP_TTL_S
    refused = review("p1")
    assert b'"allowed": false' in refused, refused[-300:]
    assert b"GpuShare first and GpuShare second" in refused


def test_a_request_sent_with_the_end_of_the_handshake_is_answered_encrypted(
    served: ServedAdmission,
) -> None:
    """TLS starts after the per-client check (start_tls); a request that arrived with the end
    of the handshake and was answered at once (the kubelet's probes, a refusal of its head)
    was answered before start_tls returned, on the raw transport: unencrypted, which the
    client could not read (WRONG_VERSION_NUMBER). Two in three such first requests failed so
    before the fix."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    base = f"https://127.0.0.1:{served.port}"
    for _ in range(20):
        with urllib.request.urlopen(f"{base}/healthz", timeout=10, context=context) as reply:
            assert reply.status == 200
        gzip = urllib.request.Request(
            f"{base}/mutate", data=b"x", headers={"Content-Encoding": "gzip"}, method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(gzip, timeout=10, context=context)
        assert refused.value.code == 415


def test_a_flood_of_reviews_asks_the_controller_little(served: ServedAdmission) -> None:
    """Each forged review of a share-linked pod asked the controller for the share: 800 a
    second of a flood cost its loop 8 % of a core. Answers are kept LOOKUP_TTL_S, and a client
    gets at most LOOKUPS_PER_CLIENT_S lookups a second the cache cannot answer (429 past)."""
    asked_before = served.process.lookups_answered
    same = review_body(pod_json("p", annotations={"gpushare.io/share": "same"}))
    for _ in range(30):
        served.request("POST", "/mutate", same, source=ATTACKER)
    assert served.process.lookups_answered - asked_before <= 5
    statuses: list[bytes] = []
    started = time.monotonic()

    def flood(worker: int) -> None:
        with served.connect(source=ATTACKER) as s:
            for i in range(120):
                pod = pod_json("p", annotations={"gpushare.io/share": f"w{worker}-{i}"})
                body = review_body(pod)
                head = f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
                s.sendall(head.encode() + body)
                statuses.append(_reply(s)[9:12])

    threads = [threading.Thread(target=flood, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    took = time.monotonic() - started
    asked = served.process.lookups_answered - asked_before
    assert asked <= 5 + LOOKUPS_PER_CLIENT_S * (took + 1.5), (asked, took)
    if len(statuses) / took > 1.5 * LOOKUPS_PER_CLIENT_S:
        assert b"429" in statuses
    # Another client's reviews are answered meanwhile.
    assert _admission(served)[0]


def _reply(s: socket.socket) -> bytes:
    """One answer on a kept connection: its head and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += s.recv(65536)
    return head
