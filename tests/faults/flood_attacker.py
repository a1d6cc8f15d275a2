"""One hostile pod's flood of every port it can reach (issue 67), as a process of its own
(one client address, ``--source``; one interpreter: at most one core, as one pod's Python
would have): run by tests/faults/test_flood_cluster.py for ``--seconds``.

- the webhook's port: idle connections (600, opened again as they are closed), 64 unfinished
  bodies of 8 MiB and of 3.9 MiB, reviews of about 2 million integers, and forged reviews as
  fast as four connections can send them;
- the node agent's port: idle connections (300) and /metrics with a made-up token on two
  connections;
- the extender's port: idle connections (300) and heads announcing 64 MiB bodies.

Prints a JSON summary of what it sent and what came back."""

import argparse
import contextlib
import json
import socket
import ssl
import threading
import time
import uuid
from collections import Counter

COUNTS: Counter[str] = Counter()
LOCK = threading.Lock()


def count(key: str, n: int = 1) -> None:
    with LOCK:
        COUNTS[key] += n


def connect(source: str, port: int, *, tls: bool, timeout: float = 10) -> socket.socket:
    sock = socket.create_connection(
        ("127.0.0.1", port), timeout=timeout, source_address=(source, 0)
    )
    if not tls:
        return sock
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context.wrap_socket(sock)


def hold_idle(source: str, port: int, n: int, stop: threading.Event, name: str) -> None:
    """Keep ``n`` idle connections open, opening again those the server closed."""
    held: list[socket.socket] = []
    while not stop.is_set():
        alive = []
        for s in held:
            s.setblocking(False)
            try:
                if s.recv(1) == b"":
                    s.close()
                    count(f"{name}_closed_by_server")
                    continue
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                count(f"{name}_closed_by_server")
                continue
            alive.append(s)
        held = alive
        while len(held) < n and not stop.is_set():
            try:
                held.append(connect(source, port, tls=False, timeout=2))
                count(f"{name}_opened")
            except OSError:
                count(f"{name}_refused")
                break
        stop.wait(0.5)
    for s in held:
        s.close()


def unfinished_bodies(source: str, port: int, size: int, stop: threading.Event) -> None:
    """64 connections announcing ``size`` bytes of body and sending 1 MiB of it."""
    chunk = b"[" + b"1," * (2**20 // 2)
    held: list[socket.socket] = []
    while not stop.is_set():
        held = [s for s in held if s.fileno() != -1]
        while len(held) < 64 and not stop.is_set():
            try:
                s = connect(source, port, tls=True, timeout=5)
                head = f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n"
                s.sendall(head.encode() + chunk)
                held.append(s)
                count(f"body_{size}_sent")
            except OSError:
                count(f"body_{size}_refused")
                break
        for s in list(held):
            s.settimeout(0.01)
            with contextlib.suppress(OSError):
                if s.recv(100):
                    count(f"body_{size}_answered")
                    s.close()
        stop.wait(0.5)
    for s in held:
        s.close()


def big_reviews(source: str, port: int, stop: threading.Event) -> None:
    ints = b"1," * (2_000_000 - 1000)
    body = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","x":[' + ints + b"1]}"
    while not stop.is_set():
        try:
            with connect(source, port, tls=True, timeout=10) as s:
                s.sendall(_post("/mutate", body))
                answer = s.recv(64)
                count("big_review_" + answer[9:12].decode(errors="replace"))
        except OSError:
            count("big_review_failed")
            stop.wait(0.1)


def forged_reviews(source: str, port: int, stop: threading.Event) -> None:
    """Forged reviews of a share-linked pod in another namespace, on one keep-alive connection."""
    while not stop.is_set():
        try:
            with connect(source, port, tls=True, timeout=10) as s:
                while not stop.is_set():
                    review = {
                        "apiVersion": "admission.k8s.io/v1",
                        "kind": "AdmissionReview",
                        "request": {
                            "uid": uuid.uuid4().hex,
                            "kind": {"group": "", "version": "v1", "kind": "Pod"},
                            "operation": "CREATE",
                            "namespace": "victim",
                            "object": {
                                "metadata": {
                                    "name": "p",
                                    "annotations": {"gpushare.io/share": "train"},
                                },
                                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                            },
                        },
                    }
                    body = json.dumps(review).encode()
                    s.sendall(_post("/mutate", body))
                    reply = _read_reply(s)
                    if not reply:
                        break
                    count("forged_review_" + reply[9:12].decode(errors="replace"))
        except OSError:
            count("forged_review_failed")
            stop.wait(0.05)


def _post(path: str, body: bytes) -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def _read_reply(s: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head


def made_up_tokens(source: str, port: int, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            with connect(source, port, tls=False, timeout=10) as s:
                s.sendall(
                    f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer made-up-"
                    f"{uuid.uuid4().hex}\r\nConnection: close\r\n\r\n".encode()
                )
                answer = s.recv(64)
                count("token_" + answer[9:12].decode(errors="replace"))
        except OSError:
            count("token_failed")
            stop.wait(0.05)


def huge_heads(source: str, port: int, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            with connect(source, port, tls=False, timeout=5) as s:
                s.sendall(
                    b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nContent-Length: 67108864"
                    b"\r\n\r\n" + b"[" * 65536
                )
                answer = s.recv(64)
                count("extender_body_" + answer[9:12].decode(errors="replace"))
        except OSError:
            count("extender_body_failed")
        stop.wait(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="127.0.0.2")
    parser.add_argument("--webhook", type=int, required=True)
    parser.add_argument("--agent", type=int, required=True)
    parser.add_argument("--extender", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    stop = threading.Event()
    src = args.source
    jobs = [
        (hold_idle, (src, args.webhook, 600, stop, "webhook_idle")),
        (unfinished_bodies, (src, args.webhook, 8 * 2**20, stop)),
        (unfinished_bodies, (src, args.webhook, 4 * 2**20 - 100_000, stop)),
        (big_reviews, (src, args.webhook, stop)),
        *[(forged_reviews, (src, args.webhook, stop)) for _ in range(4)],
        (hold_idle, (src, args.agent, 300, stop, "agent_idle")),
        *[(made_up_tokens, (src, args.agent, stop)) for _ in range(2)],
        (hold_idle, (src, args.extender, 300, stop, "extender_idle")),
        (huge_heads, (src, args.extender, stop)),
    ]
    threads = [threading.Thread(target=f, args=a, daemon=True) for f, a in jobs]
    for t in threads:
        t.start()
    time.sleep(args.seconds)
    stop.set()
    for t in threads:
        t.join(15)
    print(json.dumps(dict(sorted(COUNTS.items()))))


if __name__ == "__main__":
    main()
