"""The Helm chart end to end on the local cluster, with the image built from the Dockerfile.

`hack/build-image.sh` builds the project's Dockerfile offline (buildah) and assembles the
kube-scheduler image from the harness's binary; both are imported into the cluster's
containerd under the names the chart uses. Then, as a user would:

helm install -> every gpushare pod Ready -> annotated pods placed by the chart's
gpushare-scheduler onto simulated GPUs, with their GPU's environment inside the container ->
helm upgrade with changed values rolls cleanly -> helm uninstall leaves no gpushare object,
socket, MPS directory or node label behind.

The node is shared with other tests. The kubelet takes one device plugin per resource and the
harness's host gpushare-scheduler calls whatever listens on 127.0.0.1:8888, so the e2e waits
until no host-process controller or node agent runs, then holds both for its duration: it
answers 127.0.0.1:8888 itself (the host scheduler gets a quick "not here" and the in-cluster
scheduler places the pods; the controller fixture waits for the port) and holds the node-agent
fixture's lock (its sessions wait). If the node does not become free in time, the test skips
saying what held it.

`test_service_accounts_can_do_exactly_what_they_need` needs none of that: it applies only
the chart's RBAC under a throwaway release and asks `kubectl auth can-i`.
"""

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.api.inventory import load_inventory
from gpushare.api.names import (
    ANN_FRACTION,
    ANN_GPU_UUID,
    ANN_NODE_GPUS,
    ANN_STATE,
    ANN_THREAD_PERCENT,
    LABEL_MPS_CAPABLE,
    LABEL_SIMULATED,
    RESOURCE_GPU_PERCENT,
    SCHEDULER_NAME,
    STATE_ALLOCATED,
)
from tests.fixtures.cluster import REPO, LocalCluster
from tests.fixtures.helm_chart import CHART, LOCAL_VALUES, helm_binary

pytestmark = pytest.mark.cluster

RELEASE = "gpushare"
NAMESPACE = "gpushare-e2e"
EXTENDER_PORT = 8888
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
PLUGIN_SOCKET = DEVICE_PLUGIN_DIR / "gpushare-gpu-percent.sock"
MPS_ROOT = Path("/run/gpushare/mps")
WAIT_FOR_NODE_S = float(os.environ.get("GPUSHARE_E2E_WAIT_S", "900"))
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"
CRD = "gpushares.gpushare.io"

Obj = dict[str, Any]


# ---- helpers ------------------------------------------------------------------------------


def wait_for(check: Callable[[], Any], *, timeout_s: float, what: str, every_s: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last!r})")


def helm(
    cluster: LocalCluster, *args: str, timeout_s: float = 600
) -> subprocess.CompletedProcess[str]:
    binary = helm_binary()
    if binary is None:
        pytest.skip("helm not found: build it with `hack/build-tools.sh helm`")
    proc = subprocess.run(
        [binary, *args],
        capture_output=True,
        text=True,
        env=cluster.env,
        timeout=timeout_s,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def kjson(cluster: LocalCluster, *args: str) -> Any:
    return json.loads(cluster.kubectl(*args, "-o", "json"))


def node(cluster: LocalCluster) -> Obj:
    return kjson(cluster, "get", "node", cluster.node_name)  # type: ignore[no-any-return]


def allocatable(cluster: LocalCluster) -> int:
    return int(node(cluster)["status"].get("allocatable", {}).get(RESOURCE_GPU_PERCENT, 0))


def release_pods(cluster: LocalCluster) -> list[Obj]:
    return kjson(cluster, "get", "pods", "-n", NAMESPACE, "-l", INSTANCE)["items"]  # type: ignore[no-any-return]


def ready(pod: Obj) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def wait_ready_release_pods(cluster: LocalCluster, *, timeout_s: float) -> list[Obj]:
    """The release's pods once all are Ready (or as they are when the time is up)."""
    deadline = time.monotonic() + timeout_s
    pods = release_pods(cluster)
    while not (pods and all(ready(p) for p in pods)) and time.monotonic() < deadline:
        time.sleep(1)
        pods = release_pods(cluster)
    return pods


def component(pod: Obj) -> str:
    return str(pod["metadata"]["labels"].get("app.kubernetes.io/component", ""))


def socket_listening(path: Path) -> bool:
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1)
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def agent_processes() -> list[int]:
    """gpushare-node-agent processes on this host (the chart's run the console script)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(b"gpushare-node-agent") for part in argv[:2]):
            pids.append(int(entry.name))
    return pids


def diagnostics(cluster: LocalCluster) -> str:
    """What a failing run needs: pods, recent events, and the last lines of each gpushare pod."""
    out = [cluster.kubectl("get", "pods", "-A", "-o", "wide", check=False)]
    events = cluster.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False)
    out.append("\n".join(events.splitlines()[-30:]))
    for pod in release_pods(cluster):
        name = pod["metadata"]["name"]
        logs = cluster.kubectl("logs", "-n", NAMESPACE, name, "--tail=25", check=False)
        out.append(f"--- logs {name}")
        out += [line[:300] for line in logs.splitlines()]
    return "\n".join(out)


# ---- exclusive use of the node's gpushare slots ----------------------------------------------


class _NotHere(BaseHTTPRequestHandler):
    """Answers the host gpushare-scheduler while the in-cluster one does the work."""

    def do_POST(self) -> None:
        body = json.dumps(
            {"Error": "gpushare e2e: the in-cluster gpushare-scheduler places pods now"}
        ).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _what_holds_the_node(cluster: LocalCluster, sessions: Path) -> str | None:
    if socket_listening(PLUGIN_SOCKET):
        return f"a node agent serves {PLUGIN_SOCKET}"
    live = [
        s.name for s in sessions.glob("*") if s.name.isdigit() and Path(f"/proc/{s.name}").exists()
    ]
    if live:
        return f"pytest sessions {live} use the host node agent"
    existing = cluster.kubectl(
        "get", "mutatingwebhookconfiguration", RELEASE, "--ignore-not-found", "-o", "name"
    ).strip()
    if existing:
        return f"a webhook configuration named {RELEASE!r} exists (another controller)"
    return None


@contextlib.contextmanager
def exclusive_node(cluster: LocalCluster) -> Iterator[None]:
    shared = Path(cluster.state_dir) / "node-agent"
    (shared / "sessions").mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + WAIT_FOR_NODE_S
    reason = "?"
    while True:
        server: ThreadingHTTPServer | None = None
        lock = None
        try:
            server = ThreadingHTTPServer(("127.0.0.1", EXTENDER_PORT), _NotHere)
        except OSError:
            reason = f"a host-process controller listens on 127.0.0.1:{EXTENDER_PORT}"
        if server is not None:
            lock = (shared / "lock").open("a")
            fcntl.flock(lock, fcntl.LOCK_EX)
            held = _what_holds_the_node(cluster, shared / "sessions")
            if held is None:
                break
            reason = held
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()
            server.server_close()
        if time.monotonic() > deadline:
            pytest.skip(
                f"the node is not free for the chart e2e after {WAIT_FOR_NODE_S:.0f}s: {reason}"
            )
        time.sleep(5)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


# ---- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def images(cluster: LocalCluster) -> None:
    """Build the gpushare image from the Dockerfile (offline) and the kube-scheduler image."""
    proc = subprocess.run(
        ["bash", str(REPO / "hack" / "build-image.sh"), "all"],
        capture_output=True,
        text=True,
        env=cluster.env,
        timeout=1800,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"hack/build-image.sh failed:\n{proc.stderr[-6000:]}")


def workload_pod(cluster: LocalCluster, name: str, fraction: str) -> Obj:
    """A plain pod that asks for a share of a GPU with one annotation, nothing else."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {ANN_FRACTION: fraction}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
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


def place(cluster: LocalCluster, namespace: str, pods: dict[str, str]) -> dict[str, Obj]:
    for name, fraction in pods.items():
        manifest = workload_pod(cluster, name, fraction)
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))

    def running() -> dict[str, Obj] | None:
        got = {n: kjson(cluster, "get", "pod", "-n", namespace, n) for n in pods}
        if all(p["status"].get("phase") == "Running" for p in got.values()):
            return got
        return None

    return wait_for(running, timeout_s=120, what=f"pods {sorted(pods)} Running")  # type: ignore[no-any-return]


def container_env(cluster: LocalCluster, namespace: str, name: str) -> dict[str, str]:
    out = cluster.kubectl("exec", "-n", namespace, name, "--", "env")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def scheduler_instance(cluster: LocalCluster) -> str:
    """The reportingInstance of Scheduled events from the chart's scheduler pod."""
    scheduler = [p for p in release_pods(cluster) if component(p) == "scheduler"]
    assert len(scheduler) == 1, [p["metadata"]["name"] for p in scheduler]
    return f"{SCHEDULER_NAME}-{scheduler[0]['metadata']['name']}"


def check_placed(
    cluster: LocalCluster, namespace: str, pods: dict[str, Obj], gpu_uuids: set[str]
) -> None:
    """Each pod placed by the chart's gpushare-scheduler pod onto one of the node's GPUs, with
    that GPU's environment in its container."""
    instance = scheduler_instance(cluster)
    for name, pod in pods.items():
        ann = pod["metadata"]["annotations"]
        assert pod["spec"]["schedulerName"] == SCHEDULER_NAME, "the webhook sets the scheduler"
        assert pod["spec"]["nodeName"] == cluster.node_name
        uuid_ = ann[ANN_GPU_UUID]
        assert uuid_ in gpu_uuids, f"{name} placed on unknown GPU {uuid_}"
        assert ann[ANN_STATE] == STATE_ALLOCATED
        events = kjson(
            cluster,
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            f"involvedObject.name={name},reason=Scheduled",
        )["items"]
        assert [e.get("reportingInstance") for e in events] == [instance], (
            f"{name} was not placed by the chart's scheduler pod: {events}"
        )
        env = container_env(cluster, namespace, name)
        assert env["CUDA_VISIBLE_DEVICES"] == uuid_
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == ann[ANN_THREAD_PERCENT]
        assert int(ann[ANN_THREAD_PERCENT]) >= round(float(ann[ANN_FRACTION]) * 100), ann
        pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
        cluster.kubectl("exec", "-n", namespace, name, "--", "test", "-d", pipe)


def shares_per_gpu(cluster: LocalCluster, namespace: str, names: list[str]) -> dict[str, float]:
    """Sum of the placed pods' fractions on each GPU; none may exceed one GPU."""
    used: dict[str, float] = {}
    for name in names:
        ann = kjson(cluster, "get", "pod", "-n", namespace, name)["metadata"]["annotations"]
        used[ann[ANN_GPU_UUID]] = used.get(ann[ANN_GPU_UUID], 0.0) + float(ann[ANN_FRACTION])
    assert all(total <= 1.0 + 1e-9 for total in used.values()), f"a GPU is over-booked: {used}"
    return used


# ---- the end-to-end test ------------------------------------------------------------------


def remove_release(cluster: LocalCluster) -> None:
    """Uninstall the test release whatever state it is in (a failed or interrupted install
    leaves fail-closed webhook configurations that would refuse every gpushare pod)."""
    binary = helm_binary()
    if binary is not None:
        subprocess.run(
            [binary, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "5m"],
            capture_output=True,
            text=True,
            env=cluster.env,
            timeout=400,
            check=False,
        )
    cluster.kubectl(
        "delete",
        "mutatingwebhookconfigurations,validatingwebhookconfigurations",
        "-l",
        f"app.kubernetes.io/instance={RELEASE}",
        "--ignore-not-found",
        check=False,
    )


def test_install_place_upgrade_uninstall(cluster: LocalCluster, images: None) -> None:
    work = f"gpushare-e2e-work-{uuid.uuid4().hex[:6]}"
    with exclusive_node(cluster):
        remove_release(cluster)  # what an interrupted earlier run may have left
        try:
            # -- install: every gpushare pod Ready ----------------------------------------
            out = helm(
                cluster,
                "install",
                RELEASE,
                str(CHART),
                "--namespace",
                NAMESPACE,
                "--create-namespace",
                "--values",
                str(LOCAL_VALUES),
                "--wait",
                "--timeout",
                "5m",
            ).stdout
            assert "SIMULATED" in out, "NOTES must say the GPUs are simulated"
            # helm's --wait counts a one-node DaemonSet ready before its pod is (it allows
            # maxUnavailable=1 of 1), so the node agent gets the same 2 minutes to be Ready.
            pods = wait_ready_release_pods(cluster, timeout_s=120)
            assert sorted(component(p) for p in pods) == ["controller", "node-agent", "scheduler"]
            assert all(ready(p) for p in pods), [p["status"] for p in pods]
            images_used = {c["image"] for p in pods for c in p["spec"]["containers"]}
            assert images_used == {
                "gpushare/gpushare:0.1.0",
                "registry.k8s.io/kube-scheduler:v1.34.4",
            }
            wait_for(lambda: allocatable(cluster) == 200, timeout_s=60, what="200 gpu-percent")
            labels = node(cluster)["metadata"]["labels"]
            assert labels.get(LABEL_SIMULATED) == "true"
            assert labels.get(LABEL_MPS_CAPABLE) == "true"
            gpus = load_inventory(node(cluster)["metadata"]["annotations"][ANN_NODE_GPUS])
            uuids = {g.uuid for g in gpus}
            assert len(uuids) == 2

            # -- annotated pods placed by the chart's scheduler, right env inside -----------
            cluster.kubectl("create", "namespace", work)
            placed = place(cluster, work, {"a": "0.5", "b": "0.25", "c": "0.5", "d": "0.5"})
            check_placed(cluster, work, placed, uuids)
            used = shares_per_gpu(cluster, work, list(placed))
            assert sum(used.values()) == pytest.approx(1.75)

            # -- upgrade with changed values: every component rolls, nothing breaks ----------
            before = {component(p): p["metadata"]["uid"] for p in release_pods(cluster)}
            helm(
                cluster,
                "upgrade",
                RELEASE,
                str(CHART),
                "--namespace",
                NAMESPACE,
                "--reuse-values",
                "--set",
                "controller.logLevel=DEBUG",
                "--set",
                "node.logLevel=DEBUG",
                "--set",
                "scheduler.extenderWeight=6",
                "--wait",
                "--timeout",
                "5m",
            )
            for kind in (
                "deployment/gpushare-controller",
                "deployment/gpushare-scheduler",
                "daemonset/gpushare-node-agent",
            ):
                cluster.kubectl("rollout", "status", "-n", NAMESPACE, kind, "--timeout=120s")

            def three_ready() -> list[Obj] | None:
                pods = release_pods(cluster)
                return pods if len(pods) == 3 and all(ready(p) for p in pods) else None

            after_pods = wait_for(
                three_ready,
                timeout_s=120,
                what="three Ready gpushare pods after the upgrade",
            )
            after = {component(p): p["metadata"]["uid"] for p in after_pods}
            assert after.keys() == before.keys()
            assert all(after[k] != before[k] for k in before), "every component rolled"
            for pod in after_pods:
                for status in pod["status"]["containerStatuses"]:
                    assert status["restartCount"] == 0, status
            controller = next(p for p in after_pods if component(p) == "controller")
            assert "--log-level=DEBUG" in controller["spec"]["containers"][0]["args"]
            history = json.loads(
                helm(cluster, "history", RELEASE, "-n", NAMESPACE, "-o", "json").stdout
            )
            assert [h["status"] for h in history] == ["superseded", "deployed"]
            # Running pods kept their GPUs; a new pod fits into what the restarted controller
            # rebuilt from the placement annotations.
            for name, pod in placed.items():
                now = kjson(cluster, "get", "pod", "-n", work, name)
                assert now["metadata"]["uid"] == pod["metadata"]["uid"]
                assert now["status"]["phase"] == "Running"
            more = place(cluster, work, {"e": "0.25"})
            check_placed(cluster, work, more, uuids)
            used = shares_per_gpu(cluster, work, [*placed, *more])
            assert sum(used.values()) == pytest.approx(2.0)

            # -- uninstall: nothing of gpushare left ----------------------------------------
            cluster.kubectl("delete", "namespace", work, "--wait=true", "--timeout=120s")
            helm(
                cluster, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "5m"
            )
            check_nothing_left(cluster)
        except BaseException:
            print(diagnostics(cluster))
            raise
        finally:
            remove_release(cluster)  # quick no-op after a clean uninstall
            cluster.kubectl(
                "delete",
                "namespace",
                work,
                NAMESPACE,
                "--ignore-not-found",
                "--wait=false",
                check=False,
            )


NAMESPACED_KINDS = (
    "deployments,daemonsets,replicasets,pods,services,endpoints,configmaps,secrets,"
    "serviceaccounts,roles,rolebindings,jobs,leases"
)
CLUSTER_KINDS = (
    "clusterroles,clusterrolebindings,mutatingwebhookconfigurations,validatingwebhookconfigurations,"
    "validatingadmissionpolicies,validatingadmissionpolicybindings"
)


def check_nothing_left(cluster: LocalCluster) -> None:
    def leftovers() -> list[str]:
        names = cluster.kubectl("get", NAMESPACED_KINDS, "-A", "-l", INSTANCE, "-o", "name").split()
        names += cluster.kubectl("get", CLUSTER_KINDS, "-l", INSTANCE, "-o", "name").split()
        names += cluster.kubectl(
            "get", "pods", "-n", NAMESPACE, "-o", "name", "--ignore-not-found"
        ).split()
        return names

    wait_for(lambda: not leftovers(), timeout_s=120, what="no object of the release")
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        assert not cluster.kubectl("get", kind, RELEASE, "--ignore-not-found", "-o", "name").strip()
    # Helm never deletes CRDs (user data); it is the one thing that stays, by design.
    assert cluster.kubectl("get", "crd", CRD, "-o", "name").strip()
    meta = node(cluster)["metadata"]
    assert ANN_NODE_GPUS not in meta.get("annotations", {}), "node inventory annotation left"
    assert LABEL_MPS_CAPABLE not in meta["labels"] and LABEL_SIMULATED not in meta["labels"]
    assert not PLUGIN_SOCKET.exists(), f"{PLUGIN_SOCKET} left behind"
    assert not MPS_ROOT.exists(), f"{MPS_ROOT} left behind"
    wait_for(lambda: not agent_processes(), timeout_s=30, what="no node agent process")
    wait_for(lambda: allocatable(cluster) == 0, timeout_s=120, what="no gpu-percent allocatable")


# ---- RBAC: kubectl auth can-i per service account -----------------------------------------

RBAC_TEMPLATES = (
    "controller-rbac.yaml",
    "scheduler-rbac.yaml",
    "node-rbac.yaml",
    "uninstall-hook.yaml",
)


def _can(
    cluster: LocalCluster, sa: str, namespace: str, check: tuple[str, str, str | None]
) -> bool:
    verb, what, where = check
    # `what` is resource[/name], optionally followed by " --subresource=<sub>".
    args = ["auth", "can-i", verb, *what.split(), f"--as=system:serviceaccount:{namespace}:{sa}"]
    args += ["-n", where] if where else []
    out = cluster.kubectl(*args, check=False).strip()
    assert out in ("yes", "no"), f"kubectl {' '.join(args)}: {out!r}"
    return out == "yes"


def test_service_accounts_can_do_exactly_what_they_need(cluster: LocalCluster) -> None:
    release = f"rbac-{uuid.uuid4().hex[:6]}"
    ns = release
    full = f"{release}-gpushare"
    binary = helm_binary()
    if binary is None:
        pytest.skip("helm not found: build it with `hack/build-tools.sh helm`")
    cmd = [binary, "template", release, str(CHART), "--namespace", ns, "--kube-version", "1.34.4"]
    for template in RBAC_TEMPLATES:
        cmd += ["--show-only", f"templates/{template}"]
    rendered = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout
    # Only the RBAC objects: the hook Job would run a pod.
    docs = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] != "Job"]
    # `kubectl auth can-i` checks a custom resource's group only when the API server serves it;
    # without the CRD (no install ran first) every GpuShare check would read "no".
    cluster.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        str(CHART / "crds" / "gpushare.io_gpushares.yaml"),
    )
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", CRD)
    cluster.kubectl("create", "namespace", ns)
    try:
        cluster.kubectl("apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(d) for d in docs))
        ctl, sch, agent, hook = (
            f"{full}-{c}" for c in ("controller", "scheduler", "node-agent", "uninstall")
        )
        # (service account, verb, resource[/name], namespace or None, expected)
        matrix: list[tuple[str, str, str, str | None, bool]] = [
            # controller: extender, webhook registration, operator
            (ctl, "watch", "pods", None, True),
            (ctl, "patch", "pods", "default", True),
            (ctl, "create", "pods --subresource=binding", "default", True),
            (ctl, "create", "pods --subresource=eviction", "default", True),
            (ctl, "list", "nodes", None, True),
            (ctl, "create", "events", "default", True),
            (ctl, "patch", "gpushares.gpushare.io", "default", True),
            (ctl, "patch", "gpushares.gpushare.io --subresource=status", "default", True),
            (ctl, "list", "customresourcedefinitions.apiextensions.k8s.io", None, True),
            (
                ctl,
                "patch",
                f"mutatingwebhookconfigurations.admissionregistration.k8s.io/{full}",
                None,
                True,
            ),
            (
                ctl,
                "patch",
                f"validatingwebhookconfigurations.admissionregistration.k8s.io/{full}",
                None,
                True,
            ),
            (ctl, "create", "configmaps", ns, True),
            (ctl, "patch", f"configmaps/{full}-profile-cache", ns, True),
            (ctl, "create", "pods", "default", False),
            (ctl, "delete", "pods", "default", False),
            (ctl, "create", "pods --subresource=exec", "default", False),
            (ctl, "patch", "nodes", None, False),
            (ctl, "get", "secrets", ns, False),
            (ctl, "delete", "gpushares.gpushare.io", "default", False),
            (
                ctl,
                "patch",
                "mutatingwebhookconfigurations.admissionregistration.k8s.io/other",
                None,
                False,
            ),
            (
                ctl,
                "create",
                "mutatingwebhookconfigurations.admissionregistration.k8s.io",
                None,
                False,
            ),
            (ctl, "patch", "configmaps/other", ns, False),
            (ctl, "create", "configmaps", "default", False),
            # gpushare-scheduler: what kube-scheduler needs, its own lease
            (sch, "create", "pods --subresource=binding", "default", True),
            (sch, "watch", "pods", None, True),
            (sch, "list", "nodes", None, True),
            (sch, "create", "leases.coordination.k8s.io", ns, True),
            (sch, "update", f"leases.coordination.k8s.io/{full}-scheduler", ns, True),
            (sch, "get", "configmaps/extension-apiserver-authentication", "kube-system", True),
            (sch, "update", "leases.coordination.k8s.io/other", ns, False),
            (sch, "get", "secrets", ns, False),
            (sch, "delete", "nodes", None, False),
            (sch, "patch", "gpushares.gpushare.io", "default", False),
            # node agent: pods on its node, its node's metadata, events, its DaemonSet
            (agent, "list", "pods", None, True),
            (agent, "patch", "pods", "default", True),
            (agent, "patch", "nodes", None, True),
            (agent, "create", "events", "default", True),
            (agent, "get", f"daemonsets.apps/{agent}", ns, True),
            (agent, "create", "pods", "default", False),
            (agent, "delete", "pods", "default", False),
            (agent, "create", "pods --subresource=eviction", "default", False),
            (agent, "create", "pods --subresource=binding", "default", False),
            (agent, "patch", "nodes --subresource=status", None, False),
            (agent, "delete", "nodes", None, False),
            (agent, "get", "secrets", ns, False),
            (agent, "get", "daemonsets.apps/other", ns, False),
            # uninstall hook: delete the agents' DaemonSet, nothing else
            (hook, "delete", f"daemonsets.apps/{agent}", ns, True),
            (hook, "get", f"daemonsets.apps/{agent}", ns, True),
            (hook, "delete", "daemonsets.apps/other", ns, False),
            (hook, "delete", f"deployments.apps/{ctl}", ns, False),
            (hook, "list", "pods", ns, False),
        ]
        wrong = [
            f"{sa.removeprefix(full + '-')} {verb} {what}{' -n ' + where if where else ''}: "
            f"{'no' if expected else 'yes'}, want {'yes' if expected else 'no'}"
            for sa, verb, what, where, expected in matrix
            if _can(cluster, sa, ns, (verb, what, where)) != expected
        ]
        assert not wrong, "\n".join(wrong)
    finally:
        cluster.kubectl(
            "delete",
            "-f",
            "-",
            "--ignore-not-found",
            "--wait=false",
            input="\n---\n".join(yaml.safe_dump(d) for d in docs),
            check=False,
        )
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
