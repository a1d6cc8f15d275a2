"""gpushare's DRA driver end to end on the DRA-mode local cluster: the node agent in
``--mode dra`` (simulated GPUs, a host process) publishes the node's ResourceSlice, kube-scheduler
allocates a claim of the chart's DeviceClass, the kubelet has the agent prepare it, and
containerd applies the agent's CDI spec: the container starts with its GPU and MPS limits.
"""

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.fixtures.chart_release import wait_for
from tests.fixtures.cluster import REPO, LocalCluster
from tests.fixtures.helm_chart import CHART, KUBE_VERSION, helm_binary

pytestmark = pytest.mark.cluster

DRIVER = "gpu.gpushare.io"
METRICS_PORT = 19401  # not the device-plugin agent's 19400
Obj = dict[str, Any]
SHOW_ENV = (
    'env | grep ^CUDA_ | sort; test -d "$CUDA_MPS_PIPE_DIRECTORY" && echo pipe-ok; sleep 3600'
)


def _wait(what: str, timeout_s: float, probe: Any) -> Any:
    return wait_for(probe, timeout_s=timeout_s, what=what, every_s=0.5)


def _node_slices(c: LocalCluster) -> list[Obj]:
    raw = c.kubectl(
        "get", "resourceslices", "-o", "json",
        "--field-selector", f"spec.driver={DRIVER},spec.nodeName={c.node_name}",
    )  # fmt: skip
    items: list[Obj] = json.loads(raw)["items"]
    return items


@pytest.fixture(scope="module")
def dra_agent(dra_cluster: LocalCluster) -> Iterator[list[Obj]]:
    """The agent in dra mode for this module; stopped by PID, its slices removed after."""
    c = dra_cluster
    workdir = c.state_dir / "dra-agent"
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "gpushare.node.main", "--mode", "dra",
        "--backend", "simulated:2xH100-80GB", "--node-name", c.node_name,
        "--kubeconfig", str(c.kubeconfig), "--kubelet-root", "/var/lib/kubelet",
        "--cdi-dir", "/var/run/cdi", "--mps-root", str(workdir / "mps"),
        "--metrics-host", "127.0.0.1", "--metrics-port", str(METRICS_PORT),
        "--pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock",
    ]  # fmt: skip
    env = {**os.environ, **c.env, "PYTHONPATH": str(REPO)}
    with (workdir / "agent.log").open("ab") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
        )
    try:
        slices = _wait("the agent's ResourceSlice", 60, lambda: _node_slices(c))
        yield slices
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        c.kubectl(
            "delete", "resourceslices", "--field-selector",
            f"spec.driver={DRIVER},spec.nodeName={c.node_name}", check=False,
        )  # fmt: skip


@pytest.fixture(scope="module")
def device_class(dra_cluster: LocalCluster) -> Iterator[str]:
    helm = helm_binary()
    if helm is None:
        pytest.skip("helm not found: build it with `hack/build-tools.sh helm` (make tools)")
    out = subprocess.run(
        [helm, "template", "gpushare", str(CHART), "--kube-version", KUBE_VERSION,
         "--set", "mode=dra", "--show-only", "templates/device-class.yaml"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    dc: Obj = yaml.safe_load(out)
    dra_cluster.kubectl("apply", "-f", "-", input=json.dumps(dc))
    yield dc["metadata"]["name"]
    dra_cluster.kubectl("delete", "deviceclass", dc["metadata"]["name"], "--ignore-not-found")


def test_agent_publishes_one_shareable_device_per_gpu(dra_agent: list[Obj]) -> None:
    devices = [d for s in dra_agent for d in s["spec"]["devices"]]
    assert sorted(d["name"] for d in devices) == ["gpu-0", "gpu-1"]
    for d in devices:
        assert d["allowMultipleAllocations"] is True  # the gate is on in the API server
        assert d["capacity"]["gpuPercent"]["value"] == "100"
        assert d["attributes"]["simulated"] == {"bool": True}


def test_a_claimed_share_starts_with_its_gpu_and_mps_limit(
    dra_cluster: LocalCluster, dra_agent: list[Obj], device_class: str
) -> None:
    c = dra_cluster
    ns = f"dra-e2e-{uuid.uuid4().hex[:6]}"
    c.kubectl("create", "namespace", ns)
    try:
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "share"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": device_class,
                "capacity": {"requests": {"gpuPercent": "30"}},
            }}]}},
        }  # fmt: skip
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "job"},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "share"}],
                "containers": [{
                    "name": "main", "image": c.busybox_image, "imagePullPolicy": "Never",
                    "command": ["sh", "-c", SHOW_ENV],
                    "resources": {"claims": [{"name": "gpu"}]},
                }],
            },
        }  # fmt: skip
        c.kubectl(
            "apply",
            "-n",
            ns,
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [claim, pod]}),
        )

        def running() -> bool:
            p = json.loads(c.kubectl("get", "pod", "job", "-n", ns, "-o", "json"))
            return bool(p["status"].get("phase") == "Running")

        try:
            _wait("the pod Running", 90, running)
        except AssertionError:
            events = c.kubectl("get", "events", "-n", ns)
            raise AssertionError(f"pod not Running:\n{events}") from None
        result = json.loads(c.kubectl("get", "resourceclaim", "share", "-n", ns, "-o", "json"))
        (r,) = result["status"]["allocation"]["devices"]["results"]
        device = next(
            d for s in dra_agent for d in s["spec"]["devices"] if d["name"] == r["device"]
        )
        logs = _wait(
            "the container's output",
            30,
            lambda: (
                "pipe-ok" in c.kubectl("logs", "job", "-n", ns)
                and c.kubectl("logs", "job", "-n", ns)
            ),
        )
        env = dict(line.split("=", 1) for line in logs.splitlines() if "=" in line)
        assert env["CUDA_VISIBLE_DEVICES"] == device["attributes"]["uuid"]["string"]
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
        assert "pipe-ok" in logs  # the MPS pipe directory is mounted (CDI spec applied)
    finally:
        c.kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force", check=False)
        c.kubectl("delete", "namespace", ns, "--wait=false", check=False)
