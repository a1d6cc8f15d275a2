"""Two controller replicas under Lease leader election on the local cluster: the leader is
killed during a burst of fractional pods (the standby takes over within 15 s, no GPU
oversubscribed, no pod lost), the webhook's serving certificate is rotated while pods are
created and bound (no admission or bind fails), and a poison pod does not freeze the watch of
a restarted controller.

The replicas are real ``gpushare-controller`` host processes with ``--leader-elect``, sharing
the webhook port (the kernel spreads the API server's calls over both) and its certificate
directory; only the leader opens the extender port gpushare-scheduler calls. The session's own
controller is stopped meanwhile and started again afterwards.

Destructive for everyone on the shared cluster: waits until no other pytest runs. Pods per
burst: ``GPUSHARE_HA_PODS`` (default 24; the results use 200). Results:
$GPUSHARE_SECURITY_OUT/ha.json.
"""

import json
import os
import shutil
import socket
import ssl
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.gpushare_crd import ANN_PROFILE
from gpushare.api.names import ANN_FRACTION
from gpushare.cluster.tls import ensure_certs
from tests.faults.cluster_checks import (
    CHUNK,
    Burst,
    burst_pods,
    inventory,
    kubectl_json,
    settle,
    wait_quiet,
    wait_until,
)
from tests.fixtures.controller import EXTENDER_PORT, ControllerProcess, free_port, served_namespace
from tests.fixtures.node_agent import NodeAgentProcess

pytestmark = pytest.mark.cluster

PODS = int(os.environ.get("GPUSHARE_HA_PODS", "24"))
CONVERGE_TIMEOUT_S = float(os.environ.get("GPUSHARE_FAULT_CONVERGE_TIMEOUT_S", "300"))
TAKEOVER_TARGET_S = 15.0
RESULTS: dict[str, Any] = {}


@pytest.fixture(scope="session", autouse=True)
def quiet_cluster() -> None:
    wait_quiet(timeout_s=1200)


def extender_ready() -> bool:
    try:
        url = f"http://127.0.0.1:{EXTENDER_PORT}/readyz"
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


class Pair:
    def __init__(self, cluster: Any, session: ControllerProcess, lease_ns: str) -> None:
        self.cluster = cluster
        self.lease_ns = lease_ns
        root = Path(tempfile.mkdtemp(prefix="gpushare-ha-"))
        self.cert_dir = root / "certs"
        port = free_port()
        self.replicas = {
            who: ControllerProcess(
                kubeconfig=session.kubeconfig,
                workdir=root / who,
                webhook_port=port,
                env=session.env,
                session=session.session,
                cert_dir=self.cert_dir,
                standby=True,
                extra_args=[
                    "--leader-elect",
                    "--leader-elect-namespace",
                    lease_ns,
                    "--leader-identity",
                    who,
                    "--cert-reload-seconds",
                    "1",
                ],
            )
            for who in ("a", "b")
        }
        for replica in self.replicas.values():
            replica.workdir.mkdir(parents=True)

    def leader(self) -> str:
        lease = kubectl_json(
            self.cluster, "get", "lease", "gpushare-controller", "-n", self.lease_ns
        )
        return str(lease["spec"].get("holderIdentity") or "")


@pytest.fixture(scope="module")
def pair(
    cluster: Any, controller: ControllerProcess, node_agent: NodeAgentProcess
) -> Iterator[Pair]:
    lease_ns = f"gs-ha-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", lease_ns)
    controller.stop()
    pair = Pair(cluster, controller, lease_ns)
    try:
        pair.replicas["a"].start(timeout=120)
        assert wait_until(extender_ready, timeout_s=60), "the first replica never led"
        pair.replicas["b"].start(timeout=120)
        assert pair.leader() == "a"
        yield pair
    finally:
        for replica in pair.replicas.values():
            replica.stop()
        controller.start(timeout=120)
        cluster.kubectl("delete", "namespace", lease_ns, "--wait=false", check=False)
        out = Path(os.environ.get("GPUSHARE_SECURITY_OUT") or Path(cluster.state_dir) / "security")
        out.mkdir(parents=True, exist_ok=True)
        previous = json.loads((out / "ha.json").read_text()) if (out / "ha.json").exists() else {}
        previous.update(RESULTS)
        (out / "ha.json").write_text(json.dumps(previous, indent=2, sort_keys=True))


@pytest.fixture
def namespace(cluster: Any, controller: ControllerProcess) -> Iterator[str]:
    with served_namespace(cluster, controller, "gs-ha") as name:
        yield name


def test_killing_the_leader_during_a_burst_loses_and_double_books_nothing(
    cluster: Any, pair: Pair, namespace: str
) -> None:
    gpus = inventory(cluster)
    pods = burst_pods(cluster.busybox_image, PODS, "ha")
    burst = Burst(cluster, namespace, pods)
    burst.start()
    wait_until(lambda: burst.created >= max(CHUNK, PODS // 3), timeout_s=180)
    victim = pair.leader()
    standby = "b" if victim == "a" else "a"
    killed = time.monotonic()
    pair.replicas[victim].kill()
    took_over = wait_until(
        lambda: time.monotonic() if extender_ready() and pair.leader() == standby else None,
        timeout_s=60,
        every_s=0.1,
    )
    takeover_s = round(took_over - killed, 2) if took_over else None
    # Its supervisor (the Deployment) starts it again; it comes back as the standby.
    pair.replicas[victim].start(timeout=120)
    burst.join()
    last_pod = time.monotonic()
    settled_s, state = settle(cluster, namespace, gpus, len(pods), CONVERGE_TIMEOUT_S)
    violations = [
        *state.get("lost", []),
        *state.get("invariants", []),
        *state.get("failed_to_start", []),
        *state.get("rejected_at_admission", {}),
    ]
    if settled_s is None and not violations:
        violations.append(f"did not converge in {CONVERGE_TIMEOUT_S:.0f}s: {state}")
    RESULTS["leader_kill"] = {
        "pods": len(pods),
        "takeover_s": takeover_s,
        "target_s": TAKEOVER_TARGET_S,
        "oversubscribed": [v for v in state.get("invariants", []) if "oversubscribed" in v],
        "lost": state.get("lost", []),
        "running": state.get("running"),
        "pending_with_reason": state.get("pending_with_reason"),
        "creates_refused_meanwhile": burst.refused,
        "converge_after_last_pod_s": round(settled_s, 1) if settled_s is not None else None,
        "burst_s": round(last_pod - killed, 1),
        "new_leader": pair.leader(),
        "violations": violations,
    }
    assert takeover_s is not None and takeover_s <= TAKEOVER_TARGET_S, RESULTS["leader_kill"]
    assert not violations, violations


def served_certificate(port: int) -> bytes:
    context = ssl._create_unverified_context()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_rotating_the_webhook_certificate_fails_no_admission_or_bind(
    cluster: Any, pair: Pair, namespace: str
) -> None:
    count, rotate_after = 40, 12
    created: list[str] = []
    failed: list[str] = []
    port = pair.replicas["a"].webhook_port
    before = served_certificate(port)

    def create_pods() -> None:
        for i in range(count):
            doc = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"rot-{i:02d}", "annotations": {ANN_FRACTION: "0.02"}},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "main",
                            "image": cluster.busybox_image,
                            "imagePullPolicy": "Never",
                            "command": ["sleep", "3600"],
                        }
                    ],
                },
            }
            out = cluster.kubectl(
                "create", "-n", namespace, "-f", "-", input=json.dumps(doc), check=False
            )
            (created if f"rot-{i:02d}" in out else failed).append(f"rot-{i:02d}")
            time.sleep(0.5)

    creator = threading.Thread(target=create_pods, daemon=True)
    creator.start()
    wait_until(lambda: len(created) + len(failed) >= rotate_after, timeout_s=120)
    fresh = ensure_certs(
        Path(tempfile.mkdtemp(prefix="gs-rotated-")), hosts=["127.0.0.1", "localhost"]
    )
    # Written file by file, as a careless rotation would: the replicas must not serve the new
    # certificate before the API server trusts its CA.
    for name in ("tls.crt", "tls.key", "ca.crt"):
        tmp = pair.cert_dir / f".{name}.new"
        shutil.copyfile(Path(fresh.cert).parent / name, tmp)
        tmp.replace(pair.cert_dir / name)
        time.sleep(0.7)
    rotated = wait_until(lambda: served_certificate(port) != before, timeout_s=60)
    creator.join(timeout=300)

    def all_running() -> bool:
        pods = kubectl_json(cluster, "get", "pods", "-n", namespace)["items"]
        return len(pods) == len(created) and all(
            p["status"].get("phase") == "Running" for p in pods
        )

    bound = wait_until(all_running, timeout_s=180)
    bind_errors = [
        e["message"]
        for e in kubectl_json(cluster, "get", "events", "-n", namespace)["items"]
        if e.get("reason") == "FailedScheduling" and "bind" in str(e.get("message")).lower()
    ]
    RESULTS["certificate_rotation"] = {
        "admissions": count,
        "failed_admissions": len(failed),
        "served_new_certificate": bool(rotated),
        "all_bound_and_running": bool(bound),
        "failed_binds": len(bind_errors),
        "bind_errors": bind_errors[:3],
    }
    assert rotated, "the webhook never served the new certificate"
    assert not failed, f"admissions failed during the rotation: {failed}"
    assert bound and not bind_errors, RESULTS["certificate_rotation"]


def test_a_poison_pod_does_not_freeze_a_restarted_controllers_watch(
    cluster: Any, pair: Pair, namespace: str
) -> None:
    """Issue: gpu-fraction 1e999999999 patched after admission (here as an admin the policy
    lets through) stopped the pod watch: a restarted controller never became ready."""
    doc = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "poison", "annotations": {ANN_FRACTION: "0.05"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": cluster.busybox_image,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                }
            ],
        },
    }
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(doc))
    profile = '{"gpuModel":"x","memoryBytes":' + "9" * 5000 + "}"
    cluster.kubectl(
        "annotate",
        "pod",
        "poison",
        "-n",
        namespace,
        "--overwrite",
        f"{ANN_FRACTION}=1e999999999",
        f"{ANN_PROFILE}={profile}",
    )
    for replica in pair.replicas.values():
        replica.kill()
    for replica in pair.replicas.values():
        replica.start(timeout=120)  # ready: its first list of pods went through
    assert wait_until(extender_ready, timeout_s=60), "no replica leads after the restart"
    after = dict(doc, metadata={"name": "after", "annotations": {ANN_FRACTION: "0.05"}})
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(after))
    ran = wait_until(
        lambda: (
            kubectl_json(cluster, "get", "pod", "after", "-n", namespace)["status"].get("phase")
            == "Running"
        ),
        timeout_s=120,
    )
    failures = [
        r
        for replica in pair.replicas.values()
        for r in replica.log_records()
        if r.get("message") == "watch failed" and r.get("kind") == "Pod"
    ]
    RESULTS["poison_watch"] = {
        "pod_scheduled_after_poison": bool(ran),
        "watch_failures": len(failures),
    }
    assert ran, "a pod created after the poison pod was never placed"
    assert not failures, failures[:3]
