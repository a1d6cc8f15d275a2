"""The controller process opens one list/watch per resource kind, operator included.

Counted from the real kube-apiserver's own metric of open watches
(``apiserver_longrunning_requests{verb="WATCH"}``): starting a controller with its operator
adds exactly one watch of pods, nodes, namespaces and GpuShares. The operator reads nodes and
pods from the controller's watches, and its Kopf handlers take the GpuShare watch over from the
controller's informer (docs/architecture.md, "One watch per kind"); the handlers still act (a
new GpuShare is accepted).
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import REPO
from tests.fixtures.node_agent import wait_until

pytestmark = pytest.mark.cluster

CRD = REPO / "crds" / "gpushare.io_gpushares.yaml"
KINDS = ("pods", "nodes", "namespaces", "gpushares")
HANDOFF = "GpuShare watch handed to the operator"


def open_watches(cluster: Any) -> dict[str, int]:
    """Watches the API server holds open now, by resource (every scope summed)."""
    counts = dict.fromkeys(KINDS, 0)
    for line in cluster.kubectl("get", "--raw", "/metrics").splitlines():
        if not line.startswith("apiserver_longrunning_requests{") or 'verb="WATCH"' not in line:
            continue
        labels, _, value = line.rpartition(" ")
        for kind in KINDS:
            if f'resource="{kind}"' in labels:
                counts[kind] += int(float(value))
    return counts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def controller_with_operator(cluster: Any) -> Iterator[Path]:
    """A controller process of its own (operator on, no webhook, its own extender port)."""
    cluster.kubectl("apply", "-f", str(CRD))
    cluster.kubectl("wait", "--for", "condition=established", "crd/gpushares.gpushare.io")
    workdir = Path(tempfile.mkdtemp(prefix="gpushare-watches-"))
    log_path = workdir / "controller.log"
    env = dict(cluster.env)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    port = _free_port()
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpushare.cluster",
                "--kubeconfig",
                str(cluster.kubeconfig),
                "--extender-port",
                str(port),
                "--no-webhook",
                "--log-level",
                "INFO",
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def ready() -> bool:
        assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    try:
        wait_until(ready, timeout_s=60, what="the controller to be ready")
        yield log_path
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def test_controller_with_operator_opens_one_watch_per_kind(cluster: Any) -> None:
    before = open_watches(cluster)
    namespace = f"gpushare-watch-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    try:
        with controller_with_operator(cluster) as log_path:
            _check_watches_and_handlers(cluster, log_path, before, namespace)
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    # Stopped, the controller's watches are gone again.
    wait_until(
        lambda: open_watches(cluster) == before,
        timeout_s=30,
        what="the controller's watches to close",
        every_s=0.5,
    )


def _check_watches_and_handlers(
    cluster: Any, log_path: Path, before: dict[str, int], namespace: str
) -> None:
    wait_until(
        lambda: HANDOFF in log_path.read_text(errors="replace"),
        timeout_s=60,
        what="the operator to take the GpuShare watch over",
    )
    expected = {kind: before[kind] + 1 for kind in KINDS}
    seen: dict[str, int] = {}

    def one_each() -> bool:
        seen.update(open_watches(cluster))
        return seen == expected

    try:
        wait_until(one_each, timeout_s=30, what="one new watch per kind", every_s=0.5)
    except pytest.fail.Exception:
        pytest.fail(f"open watches before {before}, with the controller {seen}")
    # Kopf's GpuShare handlers act on the watch they took over.
    share = {
        "apiVersion": "gpushare.io/v1alpha1",
        "kind": "GpuShare",
        "metadata": {"name": "one-watch", "namespace": namespace},
        "spec": {"fraction": "0.25", "selector": {"matchLabels": {"app": "one-watch"}}},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(share))

    def accepted() -> bool:
        out = cluster.kubectl(
            "get", "gpushare", "one-watch", "-n", namespace, "-o", "json", check=False
        )
        return bool(out) and json.loads(out).get("status", {}).get("phase") == "Pending"

    wait_until(accepted, timeout_s=30, what="the operator to accept the GpuShare")
    cluster.kubectl("delete", "gpushare", "one-watch", "-n", namespace, "--timeout=30s")
