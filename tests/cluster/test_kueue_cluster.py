"""Kueue in front of gpushare: a ClusterQueue's quota on ``gpushare.io/gpu-percent`` admits
gpushare pods, holds back the ones that do not fit, and lets them run when quota frees up
(docs/queues.md).

What runs, all real:

- the Kueue manager (built from the Go module proxy by ``hack/build-tools.sh kueue``, its CRDs
  and webhook manifests from the same module) on the host with the cluster's kubeconfig and its
  plain-pod integration on, internal certificate management off: it serves its webhooks with a
  certificate this test makes, and the webhook configurations (Kueue's own, from its module)
  point at https://127.0.0.1:<port>. They, and Kueue's ``managedJobsNamespaceSelector``, match
  only namespaces labelled for this test, so nothing else on the shared cluster is gated;
- gpushare's controller (webhook and extender), the cluster's gpushare-scheduler and the node
  agent on two simulated H100s, as in tests/cluster/test_scheduling_extender.py.

Pods carry ``kueue.x-k8s.io/queue-name`` and a ``gpushare.io/gpu-fraction`` annotation, nothing
else: both webhooks mutate them (gpushare writes the gpu-percent request and its scheduler,
Kueue adds its scheduling gate), and Kueue's Workload counts the request gpushare wrote.
"""

import base64
import contextlib
import datetime as dt
import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpushare.api.inventory import load_inventory
from gpushare.api.names import (
    ANN_FRACTION,
    ANN_GPU_UUID,
    ANN_NODE_GPUS,
    ANN_STATE,
    RESOURCE_GPU_PERCENT,
    SCHEDULER_NAME,
    STATE_ALLOCATED,
)
from gpushare.api.placement import parse_placement
from gpushare.cluster.issuing import Leaf, issue, make_ca
from tests.fixtures.built_tools import build, pinned
from tests.fixtures.chart_release import kjson, wait_crds_established, wait_for
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.controller import ControllerProcess, free_port
from tests.fixtures.node_agent import NodeAgentProcess, scraper_token

pytestmark = pytest.mark.cluster

GROUP = "kueue.x-k8s.io"
API = f"{GROUP}/v1beta2"
QUEUE_LABEL = f"{GROUP}/queue-name"
KUEUE_GATE = f"{GROUP}/admission"
TEST_LABEL = "gpushare.io/test-kueue"
"""Namespaces with this label (value: the run's id) are Kueue's; no other is touched."""
QUOTA = 100  # gpushare.io/gpu-percent: one GPU's worth
FRACTION = "0.6"  # two of these do not fit in the quota, though they fit on the node's two GPUs

# Kueue's manager, started in a private mount namespace: with internal certificate management
# off it reads its metrics certificate from a fixed path under /etc/kueue. An overlay on /etc,
# seen by that process alone, holds it there; the host's /etc is never written.
_START = r"""set -eu
work=$1; shift
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$work/etc-upper,workdir=$work/etc-work" /etc
mkdir -p /etc/kueue/metrics/certs
cp "$work/certs/tls.crt" "$work/certs/tls.key" /etc/kueue/metrics/certs/
exec "$@"
"""


@dataclass(frozen=True)
class Kueue:
    run: str
    """This run's id: the test label's value and the suffix of every cluster-wide name."""
    namespace: str
    """Where the pods go: labelled for gpushare's webhook and for Kueue."""
    local_queue: str
    cluster_queue: str
    flavor: str
    workdir: Path


def _kueue_dir(cluster: LocalCluster) -> Path:
    """Build (or find cached) Kueue: ``kueue``, ``crds/`` and ``webhooks.yaml``."""
    out = build(cluster, "kueue") / f"kueue-{pinned('KUEUE_VERSION')}"
    assert (out / "kueue").is_file() and (out / "crds").is_dir(), out
    return out


def _apply(cluster: LocalCluster, *objects: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))


def _certificates(directory: Path) -> bytes:
    """A CA and a serving certificate for 127.0.0.1 in ``directory``; returns the CA."""
    now = dt.datetime.now(dt.UTC)
    ca = make_ca(now=now, days=1)
    leaf = issue(
        ca, Leaf(secret="", common_name="kueue-webhook", hosts=("127.0.0.1",)), now=now, days=1
    )
    directory.mkdir(parents=True)
    (directory / "tls.crt").write_bytes(leaf["tls.crt"])
    (directory / "tls.key").write_bytes(leaf["tls.key"])
    directory.joinpath("tls.key").chmod(0o600)
    return ca["tls.crt"]


def _config(run: str, *, namespace: str, health: int, webhook: int, certs: Path) -> dict[str, Any]:
    selector = {"matchLabels": {TEST_LABEL: run}}
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": namespace,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook, "certDir": str(certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": selector,
        "integrations": {"frameworks": ["pod"]},
        # Its aggregated API server would want an APIService and a port of its own.
        "featureGates": {"VisibilityOnDemand": False},
    }


def _webhooks(manifests: Path, run: str, *, port: int, ca: bytes) -> list[dict[str, Any]]:
    """Kueue's own webhook configurations, for pods and Kueue's objects only, served at
    https://127.0.0.1:<port> and limited to this run's namespaces."""
    out = []
    for doc in yaml.safe_load_all(manifests.read_text()):
        if not doc or not doc.get("kind", "").endswith("WebhookConfiguration"):
            continue
        hooks = []
        for hook in doc["webhooks"]:
            groups = {g for rule in hook["rules"] for g in rule["apiGroups"]}
            resources = {r for rule in hook["rules"] for r in rule["resources"]}
            if not (groups == {GROUP} or (groups == {""} and resources == {"pods"})):
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca).decode(),
            }
            hook["namespaceSelector"] = {"matchLabels": {TEST_LABEL: run}}
            hooks.append(hook)
        doc["metadata"] = {"name": f"gpushare-test-kueue-{run}"}
        doc["webhooks"] = hooks
        out.append(doc)
    assert len(out) == 2 and all(d["webhooks"] for d in out), out
    return out


@contextlib.contextmanager
def _manager(binary: Path, config: Path, work: Path, env: dict[str, str]) -> Iterator[int]:
    """The Kueue manager, stopped by its PID (SIGTERM, then SIGKILL) on the way out."""
    (work / "etc-upper").mkdir()
    (work / "etc-work").mkdir()
    with (work / "kueue.log").open("wb") as log:
        proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", _START, "kueue",
             str(work), str(binary), f"--config={config}"],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        try:
            yield proc.pid
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _queue_objects(k: Kueue) -> list[dict[str, Any]]:
    return [
        {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": k.flavor}},
        {
            "apiVersion": API,
            "kind": "ClusterQueue",
            "metadata": {"name": k.cluster_queue},
            "spec": {
                "namespaceSelector": {"matchLabels": {TEST_LABEL: k.run}},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", RESOURCE_GPU_PERCENT],
                        "flavors": [
                            {
                                "name": k.flavor,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "4"},
                                    {"name": "memory", "nominalQuota": "4Gi"},
                                    {"name": RESOURCE_GPU_PERCENT, "nominalQuota": QUOTA},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": API,
            "kind": "LocalQueue",
            "metadata": {"name": k.local_queue, "namespace": k.namespace},
            "spec": {"clusterQueue": k.cluster_queue},
        },
    ]


def _gpu_node_ready(cluster: LocalCluster) -> bool:
    node = kjson(cluster, "get", "node", cluster.node_name)
    text = (node["metadata"].get("annotations") or {}).get(ANN_NODE_GPUS)
    allocatable = int(node["status"].get("allocatable", {}).get(RESOURCE_GPU_PERCENT, "0"))
    return text is not None and allocatable == 100 * len(load_inventory(text)) > 0


@pytest.fixture(scope="module")
def kueue(
    cluster: LocalCluster, controller: ControllerProcess, node_agent: NodeAgentProcess
) -> Iterator[Kueue]:
    tools = _kueue_dir(cluster)
    wait_for(lambda: _gpu_node_ready(cluster), timeout_s=90, what="the simulated GPUs")
    run = uuid.uuid4().hex[:8]
    # Not under pytest's shared basetemp: other sessions prune it, logs must survive a failure.
    work = Path(tempfile.mkdtemp(prefix="gpushare-kueue-"))
    k = Kueue(
        run=run,
        namespace=f"gs-kueue-{run}",
        local_queue="gpu",
        cluster_queue=f"gpushare-test-{run}",
        flavor=f"gpushare-test-{run}",
        workdir=work,
    )
    system = f"gs-kueue-system-{run}"
    crds = sorted((tools / "crds").glob("*.yaml"))
    had = set(cluster.kubectl("get", "crd", "-o", "name").split())
    webhook_port, health_port = free_port(), free_port()
    ca = _certificates(work / "certs")
    config = work / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            _config(run, namespace=system, health=health_port, webhook=webhook_port,
                    certs=work / "certs")
        )
    )  # fmt: skip
    hooks = _webhooks(tools / "webhooks.yaml", run, port=webhook_port, ca=ca)
    with contextlib.ExitStack() as stack:
        try:
            for crd in crds:
                cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
            wait_crds_established(
                cluster, *(f"{p}.{GROUP}" for p in ("clusterqueues", "localqueues", "workloads"))
            )
            cluster.kubectl("create", "namespace", system)
            cluster.kubectl("create", "namespace", k.namespace)
            cluster.kubectl(
                "label", "namespace", k.namespace, controller.namespace_label, f"{TEST_LABEL}={run}"
            )
            stack.enter_context(_manager(tools / "kueue", config, work, cluster.env))
            wait_for(lambda: _ready(health_port), timeout_s=120, what="Kueue's manager ready")
            _apply(cluster, *hooks)
            _apply(cluster, *_queue_objects(k))

            def active() -> bool:
                cq = kjson(cluster, "get", "clusterqueue", k.cluster_queue)
                return any(
                    c["type"] == "Active" and c["status"] == "True"
                    for c in cq.get("status", {}).get("conditions", [])
                )

            wait_for(active, timeout_s=60, what="the ClusterQueue Active")
            yield k
        except BaseException:
            log = work / "kueue.log"
            if log.exists():
                print("--- kueue.log\n" + "\n".join(log.read_text().splitlines()[-60:]))
            print(f"--- controller\n{controller.log_tail()}")
            print(f"logs are kept in {work}")
            raise
        else:
            shutil.rmtree(work, ignore_errors=True)
        finally:
            # While Kueue runs: it removes its finalizers from the pods and the ClusterQueue.
            cluster.kubectl(
                "delete", "namespace", k.namespace, "--ignore-not-found", "--timeout=120s",
                check=False,
            )  # fmt: skip
            cluster.kubectl(
                "delete", "clusterqueue,resourceflavor", k.cluster_queue, "--ignore-not-found",
                "--timeout=60s", check=False,
            )  # fmt: skip
            for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
                cluster.kubectl(
                    "delete", kind, f"gpushare-test-kueue-{run}", "--ignore-not-found", check=False
                )
    # Kueue has stopped (the ExitStack): what it could not clean up must not linger.
    cluster.kubectl("delete", "namespace", system, "--ignore-not-found", check=False)
    for crd in crds:
        group, plural = crd.stem.split("_", 1)
        if f"customresourcedefinition.apiextensions.k8s.io/{plural}.{group}" not in had:
            cluster.kubectl("delete", "-f", str(crd), "--ignore-not-found", check=False)


# ---- helpers ----------------------------------------------------------------------------------


def queued_pod(cluster: LocalCluster, name: str, queue: str) -> dict[str, Any]:
    """What a user writes: the queue's label, a GPU share's annotation, nothing else of either."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {QUEUE_LABEL: queue},
            "annotations": {ANN_FRACTION: FRACTION},
        },
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": cluster.busybox_image,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                }
            ],
        },
    }


def pod(cluster: LocalCluster, k: Kueue, name: str) -> dict[str, Any]:
    return kjson(cluster, "get", "pod", "-n", k.namespace, name)  # type: ignore[no-any-return]


def gates(p: dict[str, Any]) -> list[str]:
    return [g["name"] for g in p["spec"].get("schedulingGates") or []]


def workload_of(cluster: LocalCluster, k: Kueue, pod_name: str) -> dict[str, Any] | None:
    """The Workload Kueue made for the pod (its owner reference names the pod)."""
    for wl in kjson(cluster, "get", "workloads", "-n", k.namespace)["items"]:
        owners = wl["metadata"].get("ownerReferences") or []
        if any(o.get("kind") == "Pod" and o.get("name") == pod_name for o in owners):
            return wl  # type: ignore[no-any-return]
    return None


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c  # type: ignore[no-any-return]
    return {}


def running_on_a_gpu(cluster: LocalCluster, k: Kueue, name: str) -> dict[str, Any] | None:
    p = pod(cluster, k, name)
    ann = p["metadata"].get("annotations") or {}
    if p["status"].get("phase") == "Running" and ann.get(ANN_STATE) == STATE_ALLOCATED:
        return p
    return None


def pending_pods(cluster: LocalCluster, controller: ControllerProcess, namespace: str) -> float:
    """``gpushare_pending_pods`` of ``namespace`` as the controller exports it (0: no series),
    read with a token allowed to get /metrics, as Prometheus reads it."""
    request = urllib.request.Request(
        f"{controller.extender_url}/metrics",
        headers={"Authorization": f"Bearer {scraper_token(cluster)}"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "gpushare_pending_pods":
            for sample in family.samples:
                if sample.labels.get("namespace") == namespace:
                    return float(sample.value)
    return 0.0


def check_placed_by_gpushare(cluster: LocalCluster, p: dict[str, Any]) -> None:
    """Bound by gpushare-scheduler (its extender chose the GPU) to one of the node's GPUs."""
    ann = p["metadata"]["annotations"]
    assert p["spec"]["schedulerName"] == SCHEDULER_NAME
    assert p["spec"]["nodeName"] == cluster.node_name
    placement = parse_placement(ann)
    assert placement is not None and placement.gpu_uuids == (ann[ANN_GPU_UUID],), ann
    node = kjson(cluster, "get", "node", cluster.node_name)
    gpus = load_inventory(node["metadata"]["annotations"][ANN_NODE_GPUS])
    assert ann[ANN_GPU_UUID] in {g.uuid for g in gpus}
    assert placement.request_percent in (None, 60), placement
    name, namespace = p["metadata"]["name"], p["metadata"]["namespace"]
    events = cluster.events(namespace, name=name, reason="Scheduled")
    assert [e.get("reportingComponent") for e in events] == [SCHEDULER_NAME], events


# ---- the test ---------------------------------------------------------------------------------


def test_cluster_queue_quota_admits_one_pod_and_queues_the_next(
    cluster: LocalCluster, kueue: Kueue, controller: ControllerProcess
) -> None:
    k = kueue
    for name in ("first", "second"):
        # Both webhooks take it: gpushare's does not refuse a pod Kueue gates.
        cluster.kubectl(
            "create", "-n", k.namespace, "-f", "-",
            input=json.dumps(queued_pod(cluster, name, k.local_queue)),
        )  # fmt: skip
        if name == "first":
            first = wait_for(
                lambda: running_on_a_gpu(cluster, k, "first"),
                timeout_s=120,
                what="the first pod admitted by Kueue and Running on a GPU",
            )
    stored = pod(cluster, k, "second")
    # gpushare's webhook wrote the request Kueue counts and its scheduler; Kueue gated it.
    main = stored["spec"]["containers"][0]["resources"]
    assert main["requests"][RESOURCE_GPU_PERCENT] == main["limits"][RESOURCE_GPU_PERCENT] == "60"
    assert stored["spec"]["schedulerName"] == SCHEDULER_NAME

    # The first: admitted (quota reserved), ungated, placed by gpushare-scheduler on a GPU.
    wl = workload_of(cluster, k, "first")
    assert condition(wl, "Admitted").get("status") == "True", wl
    assert gates(first) == []
    check_placed_by_gpushare(cluster, first)

    # The second: 60 more would make 120 of 100, so Kueue keeps it gated, saying why.
    def queued() -> dict[str, Any] | None:
        w = workload_of(cluster, k, "second")
        c = condition(w, "QuotaReserved")
        return (
            w
            if c.get("status") == "False" and RESOURCE_GPU_PERCENT in c.get("message", "")
            else None
        )

    wl = wait_for(queued, timeout_s=60, what="the second pod's Workload pending on quota")
    message = condition(wl, "QuotaReserved")["message"]
    assert "insufficient unused quota" in message, message

    def gated_by_kueue() -> dict[str, Any] | None:
        p = pod(cluster, k, "second")
        return p if condition(p, "PodScheduled").get("reason") == "SchedulingGated" else None

    wait_for(gated_by_kueue, timeout_s=30, what="the second pod reported SchedulingGated")
    time.sleep(5)  # long enough for a scheduler that ignored the gate to have placed it
    second = pod(cluster, k, "second")
    # Kueue's admission gate (v0.17 adds its topology gate beside it); nobody else's.
    assert KUEUE_GATE in gates(second), gates(second)
    assert all(g.startswith(f"{GROUP}/") for g in gates(second)), gates(second)
    assert second["status"].get("phase") == "Pending"
    # What a user sees (docs/queues.md shows it).
    print(cluster.kubectl("get", "pods,workloads", "-n", k.namespace), message, sep="\n")
    # gpushare never saw it: no node, no placement, no GPU share held for it.
    assert not second["spec"].get("nodeName")
    assert parse_placement(second["metadata"].get("annotations") or {}) is None
    # It waits for quota, not for a GPU: gpushare does not report it pending (the
    # GpusharePodsPending alert would send someone to look for FailedScheduling events).
    assert pending_pods(cluster, controller, k.namespace) == 0

    # Quota frees when the first pod goes: Kueue admits the second, gpushare places it.
    cluster.kubectl("delete", "pod", "-n", k.namespace, "first", "--wait=true", "--timeout=60s")
    second = wait_for(
        lambda: running_on_a_gpu(cluster, k, "second"),
        timeout_s=120,
        what="the second pod admitted and Running once the first is gone",
    )
    assert gates(second) == []
    check_placed_by_gpushare(cluster, second)
    assert condition(workload_of(cluster, k, "second"), "Admitted").get("status") == "True"
