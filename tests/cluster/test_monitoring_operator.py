"""gpushare in a kube-prometheus-stack-style monitoring setup: the Prometheus Operator turns the
chart's ServiceMonitors into a real Prometheus's scrape configuration, and every dashboard
panel's query returns series that name the right namespace and pod.

What runs, all real except where said:

- the Prometheus Operator (built from the Go module proxy by ``hack/build-tools.sh
  prometheus-operator``, its CRDs from the same module) on the host with the cluster's
  kubeconfig, reconciling a ``Prometheus`` that selects ServiceMonitors labelled
  ``release: kps``, as kube-prometheus-stack's does;
- the chart, installed with ``monitoring.serviceMonitor.labels.release=kps``: controller,
  gpushare-scheduler and node agent on simulated GPUs, annotated workload pods placed by it and
  a GpuShare with a stored profile;
- Prometheus v3 (built from the module proxy by the same script: Debian's package has no
  kubernetes_sd_configs) on the host, running exactly the configuration the operator
  generated (Secret ``prometheus-kps``) with the TLS assets it collected (Secret
  ``prometheus-kps-tls-assets-0``), both as its config-reloader sidecar would mount them. The
  operator's StatefulSet has 0 replicas: the official Prometheus image cannot be pulled here.
  Discovery is kubernetes_sd through the ServiceMonitors, never static targets;
- dcgm-exporter needs a real GPU and DCGM, so a stand-in on the host serves its metric names
  and labels (``UUID``, ``gpu``, ``Hostname``, ``modelName``) for the simulated GPUs, and is
  discovered like dcgm-exporter's own chart does it (a Service, its endpoints and a
  ServiceMonitor), so the dashboards' DCGM row and the DCGM join labels are checked.
"""

import base64
import contextlib
import gzip
import json
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.exposition import start_http_server as serve_registry

from gpushare.api.inventory import load_inventory
from gpushare.api.names import ANN_GPU_UUID, ANN_NODE_GPUS
from gpushare.api.profile import GpuProfile
from tests.fixtures.built_tools import build, pinned
from tests.fixtures.chart_release import (
    NAMESPACE,
    RELEASE,
    component,
    diagnostics,
    exclusive_node,
    helm,
    kjson,
    node,
    place,
    remove_release,
    wait_crds_established,
    wait_for,
    wait_ready_release_pods,
    wait_webhook_serving,
    workload_pod,
)
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.dcgm import dcgm_registry
from tests.fixtures.helm_chart import CHART, LOCAL_VALUES
from tests.fixtures.prometheus import (
    free_port,
    panel_queries,
    query,
    running_prometheus,
    substitute,
)

# The chart takes the node over (exclusive_node): run before host agents and controllers start.
pytestmark = [pytest.mark.cluster, pytest.mark.whole_node]

MONITORING = "gpushare-mon-e2e"
WORK = "gpushare-mon-work"
SELECTOR = {"release": "kps"}
# Workload pods: name -> fraction; and a GpuShare with a stored profile.
PODS = {"train-a": "0.5", "infer-b": "0.25"}
PENDING = "waits-for-two"  # asks for two whole GPUs while both are partly taken
SHARE = "trainer"
# Queries over per-pod GPU memory. On simulated GPUs no process holds a GPU, and the chart's
# node agent (unlike the standalone exporter, see test_exporter_prometheus.py) does not feed
# pods' processes to the simulated backend, so these return nothing here; on NVML they do.
# The test checks that reason holds rather than skipping them silently.
PER_POD_MEMORY = "gpushare_pod_gpu_memory_used_bytes"
AFTER_A_FAULT = ("gpushare_mps_fault_detection_seconds", "gpushare_mps_fault_recovery_seconds")
"""Gauges a node agent sets per GPU at its first MPS client fault; none happens here."""


@dataclass(frozen=True)
class Tools:
    operator: Path
    """The Prometheus Operator's binary; its CRDs are in ``crds/`` beside it."""
    prometheus: Path
    """Prometheus with kubernetes_sd (Debian's package is built without it)."""
    prometheus_version: str


def _tools(cluster: LocalCluster) -> Tools:
    """Build (or find cached) the Prometheus Operator, its CRDs and Prometheus."""
    bin_dir = build(cluster, "prometheus-operator")
    operator = bin_dir / f"prometheus-operator-{pinned('PROMETHEUS_OPERATOR_VERSION')}"
    version = pinned("PROMETHEUS_VERSION")
    tools = Tools(operator / "operator", bin_dir / f"prometheus-{version}" / "prometheus", version)
    assert tools.operator.is_file() and (operator / "crds").is_dir(), operator
    assert tools.prometheus.is_file(), tools.prometheus
    return tools


@contextlib.contextmanager
def _process(args: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[None]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            yield
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _apply(cluster: LocalCluster, *objects: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))


def _node_ip(cluster: LocalCluster) -> str:
    addresses = node(cluster)["status"]["addresses"]
    return next(a["address"] for a in addresses if a["type"] == "InternalIP")


def _apiserver(cluster: LocalCluster) -> tuple[str, bytes]:
    """The API server's URL and CA as the kubeconfig names them."""
    config = json.loads(cluster.kubectl("config", "view", "--raw", "--minify", "-o", "json"))
    entry = config["clusters"][0]["cluster"]
    if "certificate-authority-data" in entry:
        ca = base64.b64decode(entry["certificate-authority-data"])
    else:
        ca = Path(entry["certificate-authority"]).read_bytes()
    return entry["server"], ca


def _prometheus(cluster: LocalCluster, *, work: Path, token: str, version: str) -> dict[str, Any]:
    """A Prometheus like kube-prometheus-stack's (ServiceMonitors chosen by the release label),
    reading the API server with a ServiceAccount token that may only discover targets and get
    /metrics (it scrapes gpushare with the same token). The
    token and CA are files of the host Prometheus (``credentialsFile``, ``caFile``), as a pod
    would have them mounted."""
    server, ca = _apiserver(cluster)
    (work / "apiserver-token").write_text(token)
    (work / "apiserver-ca.crt").write_bytes(ca)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Prometheus",
        "metadata": {"name": "kps", "namespace": MONITORING},
        "spec": {
            "version": version,
            "replicas": 0,
            "scrapeInterval": "2s",
            "evaluationInterval": "2s",
            "serviceMonitorSelector": {"matchLabels": SELECTOR},
            "ruleSelector": {"matchLabels": SELECTOR},
            "ruleNamespaceSelector": {},
            "serviceMonitorNamespaceSelector": {},
            "podMonitorSelector": {"matchLabels": SELECTOR},
            "podMonitorNamespaceSelector": {},
            "apiserverConfig": {
                "host": server,
                "authorization": {
                    "type": "Bearer",
                    "credentialsFile": str(work / "apiserver-token"),
                },
                "tlsConfig": {"caFile": str(work / "apiserver-ca.crt")},
            },
        },
    }


DISCOVERY_RBAC = [
    {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "prometheus", "namespace": MONITORING},
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "gpushare-mon-e2e-prometheus"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["services", "endpoints", "pods", "nodes"],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["get", "list", "watch"],
            },
            # As kube-prometheus-stack's Prometheus: gpushare answers /metrics to nothing less.
            {"nonResourceURLs": ["/metrics"], "verbs": ["get"]},
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "gpushare-mon-e2e-prometheus"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "gpushare-mon-e2e-prometheus",
        },
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": MONITORING}],
    },
]


# ---- the dcgm-exporter stand-in ----------------------------------------------------------------


@contextlib.contextmanager
def dcgm_stand_in(cluster: LocalCluster, host: str) -> Iterator[None]:
    """Serve dcgm-exporter's series for the node's (simulated) GPUs on the node's address and
    publish them as dcgm-exporter's chart would: Service + endpoints + ServiceMonitor."""
    gpus = load_inventory(node(cluster)["metadata"]["annotations"][ANN_NODE_GPUS])
    registry = dcgm_registry(gpus, hostname=cluster.node_name)
    port = free_port(host)
    server, thread = serve_registry(port, addr=host, registry=registry)
    app = {"app.kubernetes.io/name": "dcgm-exporter"}
    _apply(
        cluster,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "dcgm-exporter", "namespace": MONITORING, "labels": app},
            "spec": {"ports": [{"name": "metrics", "port": port, "targetPort": port}]},
        },
        {
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": {"name": "dcgm-exporter", "namespace": MONITORING, "labels": app},
            "subsets": [
                {"addresses": [{"ip": host}], "ports": [{"name": "metrics", "port": port}]}
            ],
        },
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": {
                "name": "dcgm-exporter",
                "namespace": MONITORING,
                "labels": {**app, **SELECTOR},
            },
            "spec": {
                "selector": {"matchLabels": app},
                "endpoints": [{"port": "metrics", "interval": "2s"}],
            },
        },
    )
    try:
        yield
    finally:
        server.shutdown()
        thread.join(5)


# ---- Prometheus running the operator's configuration ------------------------------------------


def _secret_data(cluster: LocalCluster, name: str) -> dict[str, bytes] | None:
    found = kjson(
        cluster, "get", "secrets", "-n", MONITORING, "--field-selector", f"metadata.name={name}"
    )
    items = found["items"]
    if not items:
        return None
    return {k: base64.b64decode(v) for k, v in (items[0].get("data") or {}).items()}


def generated_config(cluster: LocalCluster, work: Path) -> Path:
    """The operator's prometheus.yaml as its config-reloader sidecar hands it to Prometheus:
    ``$(VAR)`` references expanded from the pod's environment (the shard number the sharding
    relabeling keeps, the pod name), and the TLS assets where the config points (the pod mounts
    them at /etc/prometheus/certs; here they go to a directory of the test's own)."""

    def ready() -> str | None:
        data = _secret_data(cluster, "prometheus-kps")
        if not data or "prometheus.yaml.gz" not in data:
            return None
        text = gzip.decompress(data["prometheus.yaml.gz"]).decode()
        # Wait until every ServiceMonitor made it in (the operator resyncs on changes).
        wanted = [
            f"serviceMonitor/{NAMESPACE}/{RELEASE}-controller/0",
            f"serviceMonitor/{NAMESPACE}/{RELEASE}-node-agent/0",
            f"serviceMonitor/{MONITORING}/dcgm-exporter/0",
        ]
        if "/etc/prometheus/rules/" not in text:
            return None  # the chart's PrometheusRule not selected yet
        return text if all(w in text for w in wanted) else None

    text = wait_for(ready, timeout_s=120, what="the operator's generated Prometheus config")
    # The rule files the operator made of the selected PrometheusRules, where the pod would
    # mount their ConfigMap.
    rules = work / "rules"
    rules.mkdir(exist_ok=True)
    made = json.loads(
        cluster.kubectl(
            "get", "configmap", "-n", MONITORING, "prometheus-kps-rulefiles-0", "-o", "json"
        )
    )
    for key, value in made["data"].items():
        (rules / key).write_text(value)
    text = text.replace("/etc/prometheus/rules/prometheus-kps-rulefiles-0/", f"{rules}/")
    certs = work / "certs"
    certs.mkdir(exist_ok=True)
    for name in ("prometheus-kps-tls-assets-0",):
        for key, value in (_secret_data(cluster, name) or {}).items():
            (certs / key).write_bytes(value)
    text = text.replace("/etc/prometheus/certs/", f"{certs}/")
    # The pod's own ServiceAccount token, which the ServiceMonitors scrape gpushare with.
    text = text.replace(
        "/var/run/secrets/kubernetes.io/serviceaccount/token", str(work / "apiserver-token")
    )
    pod_env = {"SHARD": "0", "POD_NAME": "prometheus-kps-0"}  # shard 0's first replica
    unknown = set(re.findall(r"\$\((\w+)\)", text)) - set(pod_env)
    assert not unknown, f"the generated config references {unknown}, which no pod env sets"
    text = re.sub(r"\$\((\w+)\)", lambda m: pod_env[m.group(1)], text)
    config = work / "prometheus.yaml"
    config.write_text(text)
    return config


def _targets(base: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{base}/api/v1/targets?state=active", timeout=10) as resp:
        return json.load(resp)["data"]["activeTargets"]  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Monitored:
    prometheus: str
    config: str
    placed: dict[str, dict[str, Any]]


def profiled_share(cluster: LocalCluster) -> None:
    """A GpuShare in phase Packed with a stored profile, written to its status as the operator
    stores it (``GpuProfile.to_status``) instead of waiting for a profiling run
    (tests/cluster/test_readme.py, on examples/, and the operator's tests cover profiling).
    What this test checks, the controller exporting the stored profile, is real."""
    _apply(
        cluster,
        {
            "apiVersion": "gpushare.io/v1alpha1",
            "kind": "GpuShare",
            "metadata": {"name": SHARE, "namespace": WORK},
            "spec": {"fraction": "0.25", "profiling": {"mode": "skip"}},
        },
    )
    profile = GpuProfile(
        gpu_model="NVIDIA H100 80GB HBM3",
        fp16=0.02,
        fp32=0.31,
        fp64=0.0,
        tensor=0.58,
        sm_occupancy=0.4,
        dram_bandwidth=0.22,
        memory_used_bytes_max=6 * 2**30,
        sampled_seconds=10.0,
        time=datetime.now(UTC),
        simulated=True,
        tensor_hmma=0.58,
    )
    cluster.kubectl(
        "patch", "gpushare", SHARE, "-n", WORK, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"phase": "Packed", "profile": profile.to_status()}}),
    )  # fmt: skip


@pytest.fixture(scope="module")
def monitored(
    cluster: LocalCluster, images: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Monitored]:
    tools = _tools(cluster)
    # Not under pytest's shared basetemp: other sessions prune it, logs must survive a failure.
    work = Path(tempfile.mkdtemp(prefix="gpushare-monitoring-"))
    crds = sorted((tools.operator.parent / "crds").glob("*.yaml"))
    had = set(cluster.kubectl("get", "crd", "-o", "name").split())
    with exclusive_node(cluster), contextlib.ExitStack() as stack:
        remove_release(cluster)
        try:
            for crd in crds:
                cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
            wait_crds_established(
                cluster,
                "servicemonitors.monitoring.coreos.com",
                "prometheuses.monitoring.coreos.com",
                "prometheusrules.monitoring.coreos.com",
            )
            cluster.kubectl("create", "namespace", MONITORING)
            cluster.kubectl("create", "namespace", WORK)
            _apply(cluster, *DISCOVERY_RBAC)
            token = cluster.kubectl(
                "create", "token", "prometheus", "-n", MONITORING, "--duration=2h"
            ).strip()
            env = {**cluster.env}
            stack.enter_context(
                _process(
                    [
                        str(tools.operator),
                        f"--web.listen-address=127.0.0.1:{free_port()}",
                        f"--namespaces={MONITORING},{NAMESPACE}",
                        "--log-level=info",
                    ],
                    work / "operator.log",
                    env=env,
                )
            )
            # As kube-prometheus-stack users install it: ServiceMonitors labelled for the
            # stack's Prometheus, scraped every 2 s so the test need not wait long.
            helm(
                cluster, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                "--create-namespace", "--values", str(LOCAL_VALUES),
                "--set", "monitoring.serviceMonitor.labels.release=kps",
                "--set", "monitoring.serviceMonitor.interval=2s",
                "--set", "monitoring.prometheusRule.enabled=true",
                "--set", "monitoring.prometheusRule.labels.release=kps",
                "--wait", "--timeout", "5m",
            )  # fmt: skip
            pods = wait_ready_release_pods(cluster, timeout_s=120)
            wait_webhook_serving(cluster)
            # Two controller replicas (one leads), the scheduler and one node agent.
            assert sorted(component(p) for p in pods) == [
                "controller", "controller", "node-agent", "scheduler",
            ]  # fmt: skip
            assert all(p["status"].get("phase") == "Running" for p in pods)
            wait_for(
                lambda: ANN_NODE_GPUS in (node(cluster)["metadata"].get("annotations") or {}),
                timeout_s=60,
                what="the node agent's GPU inventory",
            )
            _apply(
                cluster,
                _prometheus(cluster, work=work, token=token, version=tools.prometheus_version),
            )
            placed = place(cluster, WORK, PODS)
            profiled_share(cluster)
            # Two whole GPUs, on a node whose GPUs are partly taken: stays pending.
            cluster.kubectl(
                "apply", "-n", WORK, "-f", "-",
                input=json.dumps(workload_pod(cluster, PENDING, "2")),
            )  # fmt: skip
            stack.enter_context(dcgm_stand_in(cluster, _node_ip(cluster)))
            config = generated_config(cluster, work)
            base = stack.enter_context(running_prometheus(config, work, binary=tools.prometheus))

            def targets_up() -> bool:
                targets = _targets(base)
                return len(targets) >= 3 and all(t["health"] == "up" for t in targets)

            try:
                wait_for(targets_up, timeout_s=120, what="every discovered target up")
            except AssertionError:
                for t in _targets(base):
                    print(t["scrapePool"], t["scrapeUrl"], t["health"], t.get("lastError"))
                raise
            # Two scrapes after everything was placed, so rate/increase panels have data.
            time.sleep(6)
            yield Monitored(prometheus=base, config=config.read_text(), placed=placed)
        except BaseException:
            print(diagnostics(cluster))
            for log in ("operator.log", "prometheus.log"):
                path = work / log
                if path.exists():
                    print(f"--- {log}\n" + "\n".join(path.read_text().splitlines()[-40:]))
            print(f"logs and the generated configuration are kept in {work}")
            raise
        else:
            shutil.rmtree(work, ignore_errors=True)
        finally:
            cluster.remove_namespace(WORK)
            cluster.kubectl(
                "delete", "prometheus", "kps", "-n", MONITORING, "--ignore-not-found", check=False
            )
            remove_release(cluster)
            cluster.kubectl(
                "delete", "namespace", MONITORING, NAMESPACE, "--ignore-not-found",
                "--wait=true", "--timeout=120s", check=False,
            )  # fmt: skip
            cluster.kubectl(
                "delete", "clusterrole,clusterrolebinding", "gpushare-mon-e2e-prometheus",
                "--ignore-not-found", check=False,
            )  # fmt: skip
            for crd in crds:
                group, plural = crd.stem.split("_", 1)
                if f"customresourcedefinition.apiextensions.k8s.io/{plural}.{group}" not in had:
                    cluster.kubectl("delete", "-f", str(crd), "--ignore-not-found", check=False)


# ---- the dashboards' queries ------------------------------------------------------------------


def test_targets_come_from_servicemonitors_not_static_configs(monitored: Monitored) -> None:
    config = yaml.safe_load(monitored.config)
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert {
        f"serviceMonitor/{NAMESPACE}/{RELEASE}-controller/0",
        f"serviceMonitor/{NAMESPACE}/{RELEASE}-node-agent/0",
    } <= jobs
    for job in config["scrape_configs"]:
        assert "static_configs" not in job, job["job_name"]
        assert job["kubernetes_sd_configs"], job["job_name"]
    pools = {t["scrapePool"] for t in _targets(monitored.prometheus) if t["health"] == "up"}
    assert f"serviceMonitor/{NAMESPACE}/{RELEASE}-node-agent/0" in pools
    assert f"serviceMonitor/{NAMESPACE}/{RELEASE}-controller/0" in pools


def test_the_charts_alert_rules_are_loaded_and_evaluate(monitored: Monitored) -> None:
    """The PrometheusRule, selected by the operator like kube-prometheus-stack's, runs in the
    real Prometheus: every rule evaluates without error, and the two-GPU pod that cannot be
    placed here makes GpusharePodsPending pending for its namespace (it fires after 15 min)."""

    def rules() -> list[dict[str, Any]] | None:
        url = f"{monitored.prometheus}/api/v1/rules?type=alert"
        with urllib.request.urlopen(url, timeout=10) as resp:
            groups = json.load(resp)["data"]["groups"]
        got = [r for g in groups if g["name"].startswith("gpushare-") for r in g["rules"]]
        evaluated = got and all(r.get("lastEvaluation", "").startswith("2") for r in got)
        return got if evaluated and not str(got[0]["lastEvaluation"]).startswith("0001") else None

    loaded = wait_for(rules, timeout_s=60, what="the gpushare alert rules evaluated")
    assert len(loaded) >= 16
    assert [r["name"] for r in loaded if r["health"] != "ok"] == [], loaded
    pending = wait_for(
        lambda: [
            a
            for r in rules() or []
            if r["name"] == "GpusharePodsPending"
            for a in r.get("alerts", [])
            if a["labels"].get("namespace") == WORK
        ],
        timeout_s=60,
        what="GpusharePodsPending for the unplaceable pod's namespace",
    )
    assert pending[0]["state"] in ("pending", "firing")
    # Nothing else is wrong here: no other alert is even pending.
    others = [
        (r["name"], a["labels"]) for r in rules() or [] for a in r.get("alerts", [])
        if r["name"] != "GpusharePodsPending"
    ]  # fmt: skip
    assert others == []


def test_every_dashboard_panel_query_returns_data(monitored: Monitored) -> None:
    queries = panel_queries()
    assert len(queries) >= 40
    empty = []
    for board, title, expr in queries:
        if PER_POD_MEMORY in expr:
            continue  # checked below
        if any(series in expr for series in AFTER_A_FAULT):
            continue  # a GPU's first MPS client fault sets them: tests/gpu, docs/reliability.md
        if not query(monitored.prometheus, substitute(expr)):
            empty.append(f"{board}: {title}: {expr}")
    assert empty == [], "panels without data:\n" + "\n".join(empty)


def test_per_pod_memory_is_absent_only_because_simulated_gpus_hold_no_process(
    monitored: Monitored,
) -> None:
    """The one kind of query not fed on simulated GPUs: say why, and prove the reason."""
    assert query(monitored.prometheus, f"{PER_POD_MEMORY}") == []
    unattributed = query(monitored.prometheus, "gpushare_gpu_unattributed_memory_used_bytes")
    assert len(unattributed) == 2 and {r["value"][1] for r in unattributed} == {"0"}
    assert {r["metric"]["simulated"] for r in unattributed} == {"true"}


def test_per_pod_series_name_the_workloads_namespace_and_pod(monitored: Monitored) -> None:
    """honorLabels: series about a pod carry that pod's namespace and name, not the node
    agent's; nothing is renamed to exported_namespace/exported_pod."""
    expected = {(WORK, name) for name in monitored.placed}
    for board, title, expr in panel_queries():
        if "gpushare_pod_" not in expr or PER_POD_MEMORY in expr:
            continue
        rows = query(monitored.prometheus, substitute(expr))
        assert rows, f"{board}: {title}"
        for row in rows:
            labels = row["metric"]
            if "pod" in labels:
                assert (labels.get("namespace"), labels["pod"]) in expected, (title, labels)
            elif "namespace" in labels:
                assert labels["namespace"] == WORK, (title, labels)
    assert query(monitored.prometheus, '{__name__=~"gpushare_.*", exported_pod!=""}') == []
    assert query(monitored.prometheus, '{__name__=~"gpushare_.*", exported_namespace!=""}') == []
    # The workload dashboard's $namespace variable lists the workload's namespace only.
    namespaces = query(
        monitored.prometheus, "count by (namespace) (gpushare_pod_gpu_allocated_compute_ratio)"
    )
    assert {r["metric"]["namespace"] for r in namespaces} == {WORK}
    pending = query(monitored.prometheus, "gpushare_pending_pods")
    assert {r["metric"]["namespace"]: r["value"][1] for r in pending} == {WORK: "1"}


def test_controller_series_are_counted_once_over_its_replicas(monitored: Monitored) -> None:
    """Issue #46: both controller replicas are scraped, yet the cluster's state comes from the
    leader alone, so the dashboards' sum() reads one pending pod as one; each process says
    its version once."""

    def replicas() -> int:
        rows = query(monitored.prometheus, 'gpushare_build_info{component="controller"}')
        return len(rows) if len(rows) == 2 else 0

    wait_for(replicas, timeout_s=60, what="both controller replicas' build_info")
    agents = query(monitored.prometheus, 'gpushare_build_info{component="node-agent"}')
    assert len(agents) == 1
    assert [r["value"][1] for r in agents] == ["1"]
    pending = query(monitored.prometheus, "gpushare_pending_pods")
    assert len(pending) == 1, pending
    total = query(monitored.prometheus, "sum(gpushare_pending_pods)")
    assert [r["value"][1] for r in total] == ["1"]
    nodes = query(monitored.prometheus, "gpushare_controller_nodes")
    assert len(nodes) == 1, nodes


def test_placements_in_prometheus_match_the_pods(monitored: Monitored) -> None:
    rows = query(
        monitored.prometheus, f'gpushare_pod_gpu_allocated_compute_ratio{{namespace="{WORK}"}}'
    )
    got = {r["metric"]["pod"]: (r["metric"]["gpu_uuid"], float(r["value"][1])) for r in rows}
    for name, fraction in PODS.items():
        uuid = monitored.placed[name]["metadata"]["annotations"][ANN_GPU_UUID]
        assert got[name] == (uuid, pytest.approx(float(fraction)))


def test_gpushare_series_join_dcgm_series_on_uuid_and_gpu(monitored: Monitored) -> None:
    """The node agent's ServiceMonitor copies gpu_uuid/gpu_index to DCGM's UUID/gpu."""
    info = query(monitored.prometheus, "gpushare_gpu_info")
    assert len(info) == 2
    for row in info:
        labels = row["metric"]
        assert labels["UUID"] == labels["gpu_uuid"] and labels["gpu"] == labels["gpu_index"]
    joined = query(
        monitored.prometheus,
        "gpushare_gpu_allocated_compute_ratio * on (UUID, gpu) group_left (modelName) "
        "DCGM_FI_DEV_GPU_UTIL",
    )
    assert len(joined) == 2
    assert all(r["metric"]["modelName"] for r in joined)
