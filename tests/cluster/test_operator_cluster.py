"""The GpuShare operator against the local cluster's real API server, kubelet, scheduler,
controller (extender + webhook) and node agent on simulated GPUs.

The operator runs as its own process (``python -m tests.fixtures.standalone_operator``) scoped
to a fresh namespace, so it never touches other tests' pods, and is killed with SIGKILL where a test
proves it resumes without repeating side effects.
"""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.bounds import parse_rfc3339
from gpushare.api.gpushare_crd import ANN_PACKING_POLICY, ANN_PROFILING
from gpushare.api.names import (
    ANN_BIND_TIME,
    ANN_CLASS,
    ANN_FRACTION,
    ANN_GPU_UUID,
    ANN_LIMIT,
    ANN_MEMORY,
    ANN_MEMORY_LIMIT,
    ANN_OPPORTUNISTIC,
    ANN_PAUSE,
    ANN_PAUSED,
    ANN_REQUEST_PERCENT,
    ANN_SHARE,
    ANN_STATE,
    ANN_THREAD_PERCENT,
    ANN_TIER,
    LABEL_NEIGHBOUR_RULES,
    LABEL_SHARE_SELECTORS,
    OPPORTUNISTIC_PRIORITY,
    RESOURCE_GPU_OPPORTUNISTIC,
    RESOURCE_GPU_PERCENT,
    STATE_ALLOCATED,
    TIER_GUARANTEED,
    TIER_OPPORTUNISTIC,
)
from gpushare.api.pause import REASON_GUARANTEED, load_pause_request, load_pause_state
from gpushare.api.profile import GpuProfile
from gpushare.node.simload import PIPE_WEIGHTS
from gpushare.packing.sizing import as_fraction, suggested_percent
from gpushare.packing.stored_profile import pipe_profile
from tests.fixtures.node_agent import NodeAgentProcess, profile_token, wait_until

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "gpushare.io_gpushares.yaml"
SIMULATED_MODEL = "NVIDIA H100 80GB HBM3"


# ---- helpers -------------------------------------------------------------------------------


PRIORITY_CLASS = {
    "apiVersion": "scheduling.k8s.io/v1",
    "kind": "PriorityClass",
    "metadata": {"name": "gpushare-opportunistic"},
    "value": OPPORTUNISTIC_PRIORITY,
    "preemptionPolicy": "Never",
}


@dataclass
class OperatorProcess:
    """``python -m tests.fixtures.standalone_operator`` scoped to one namespace."""

    cluster: Any
    namespace: str
    agent_url: str
    log_path: Path
    args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        env = {**self.cluster.env, "PYTHONPATH": str(REPO)}
        ready_marks = self.log_text().count("gpushare operator ready")
        # Node agents answer /profile only to a token bound to their audience.
        token_file = self.log_path.with_name(f"{self.log_path.stem}-agent-token")
        token_file.write_text(profile_token(self.cluster))
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.fixtures.standalone_operator",
                    "--watch-namespace",
                    self.namespace,
                    "--namespace",
                    self.namespace,
                    "--agent-url",
                    self.agent_url,
                    "--reconcile-interval",
                    "1",
                    "--agent-token-file",
                    str(token_file),
                    *self.args,
                ],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.starts += 1

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"operator exited {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            return self.log_text().count("gpushare operator ready") > ready_marks

        wait_until(ready, timeout_s=60, what="the operator to start")

    def kill(self) -> None:
        """SIGKILL by PID: no cleanup, like a crashed or OOM-killed operator."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def apply(cluster: Any, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))


def get(cluster: Any, kind: str, name: str, namespace: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json")))


def share_manifest(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpushare.io/v1alpha1",
        "kind": "GpuShare",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def pod_manifest(
    name: str,
    namespace: str,
    *,
    image: str,
    annotations: dict[str, str],
    labels: dict[str, str] | None = None,
    command: tuple[str, ...] = ("sleep", "3600"),
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {"name": "main", "image": image, "imagePullPolicy": "Never", "command": list(command)}
        ],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels or {},
            "annotations": annotations,
        },
        "spec": spec,
    }


def share_status(cluster: Any, name: str, namespace: str) -> dict[str, Any]:
    return dict(get(cluster, "gpushare", name, namespace).get("status") or {})


def events(cluster: Any, namespace: str, *, name: str, reason: str) -> int:
    """How many times ``reason`` was reported about object ``name`` (Event counts summed)."""
    found = cluster.events(namespace, name=name, reason=reason)
    return sum(int(e.get("count") or 1) for e in found)


def wait_phase(
    cluster: Any, name: str, namespace: str, phase: str, timeout_s: float
) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        status = share_status(cluster, name, namespace)
        return status if status.get("phase") == phase else None

    result: dict[str, Any] = wait_until(
        reached, timeout_s=timeout_s, what=f"GpuShare {name} to be {phase}", every_s=0.5
    )
    return result


def wait_pod_running(
    cluster: Any, name: str, namespace: str, timeout_s: float = 90
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pod = get(cluster, "pod", name, namespace)
        if pod.get("status", {}).get("phase") == "Running":
            return pod
        time.sleep(0.5)
    seen = cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}"
    )
    pytest.fail(f"pod {name} not running after {timeout_s:.0f}s; its events:\n{seen}")


def pod_gone(cluster: Any, name: str, namespace: str) -> bool:
    out = cluster.kubectl("get", "pod", name, "-n", namespace, "--ignore-not-found", "-o", "name")
    return not out.strip()


@pytest.fixture(scope="module")
def crd(cluster: Any) -> None:
    cluster.kubectl("apply", "-f", str(CRD))
    cluster.kubectl("wait", "--for", "condition=established", "crd/gpushares.gpushare.io")


@pytest.fixture
def namespace(cluster: Any, crd: None, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"gpushare-op-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    if "controller" in request.fixturenames:
        # The test controller's webhook serves only namespaces carrying its label.
        label = request.getfixturevalue("controller").namespace_label
        cluster.kubectl("label", "namespace", name, label)
    # An admin's grant: the operator's profiling pods run alone on their GPU here.
    cluster.kubectl("label", "namespace", name, f"{LABEL_NEIGHBOUR_RULES}=granted")
    # And consent to GpuShare selectors: they link the new pods whose labels they match.
    cluster.kubectl("label", "namespace", name, f"{LABEL_SHARE_SELECTORS}=enabled")
    yield name
    drop_share_finalizers(cluster, name)
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def drop_share_finalizers(cluster: Any, namespace: str) -> None:
    """Before a test namespace is deleted: its operator may already be gone."""
    out = cluster.kubectl("get", "gpushares", "-n", namespace, "-o", "name", check=False)
    for share in out.split():
        cluster.kubectl(
            "patch", share, "-n", namespace, "--type", "merge", "-p",
            '{"metadata":{"finalizers":null}}', check=False,
        )  # fmt: skip


@pytest.fixture
def operator(
    cluster: Any, namespace: str, node_agent: NodeAgentProcess, tmp_path: Path
) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(
        cluster=cluster,
        namespace=namespace,
        agent_url=f"http://127.0.0.1:{node_agent.metrics_port}",
        log_path=tmp_path / "operator.log",
        args=["--no-protection"],
    )
    proc.start()
    yield proc
    proc.stop()


# ---- the schema ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"fraction": "1.5"}, "spec.fraction must be greater than 0 and at most one GPU"),
        ({"fraction": "12.5%"}, "spec.fraction must be a fraction with at most two decimals"),
        ({"fraction": "0.5", "memory": "10GB"}, 'spec.memory must be a quantity like "10Gi"'),
        ({"fraction": "0.5", "memory": "0Gi"}, "spec.memory must be greater than 0"),
        ({"fraction": "0.5", "class": "urgent"}, 'supported values: "latency", "batch"'),
        (
            {"fraction": "0.5", "class": "latency", "packing": {"policy": "aggressive"}},
            "aggressive packing cannot protect a latency-class job",
        ),
        ({"fraction": "0.5", "selector": {}}, "spec.selector is empty and would match every pod"),
        (
            {"fraction": "0.5", "profiling": {"windowSeconds": 5}},
            "spec.profiling.windowSeconds in body should be greater than or equal to 10",
        ),
        (
            {"fraction": "0.5", "packing": {"maxPodsPerGpu": 64}},
            "spec.packing.maxPodsPerGpu in body should be less than or equal to 48",
        ),
        ({"memory": "1Gi"}, "spec.fraction is required: write the share of one GPU each pod"),
        ({"fraction": "Auto"}, 'a whole percent like "25%", or "auto"'),
        ({"fraction": "auto", "limit": "0.5"}, "spec.limit cannot be set with fraction auto"),
        (
            {"fraction": "auto", "profiling": {"mode": "skip"}},
            "spec.profiling.mode: skip leaves fraction auto without a profile",
        ),
    ],
)
def test_api_server_refuses_bad_specs_with_a_message_naming_the_field(
    cluster: Any, crd: None, spec: dict[str, Any], message: str
) -> None:
    manifest = json.dumps(share_manifest("bad", "default", **spec))
    proc = subprocess.run(
        ["kubectl", "apply", "--dry-run=server", "-f", "-"],
        input=manifest,
        capture_output=True,
        text=True,
        env=cluster.env,
        check=False,
    )
    assert proc.returncode != 0, f"accepted: {spec}"
    assert message in proc.stderr, proc.stderr
    if "fraction" not in spec:  # in the project's words alone (issue 68)
        assert "validation rules were not checked" not in proc.stderr, proc.stderr


def test_api_server_accepts_a_good_spec_and_fills_defaults(cluster: Any, crd: None) -> None:
    manifest = json.dumps(
        share_manifest("good", "default", fraction="25%", selector={"matchLabels": {"a": "b"}})
    )
    out = cluster.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-", input=manifest)
    spec = json.loads(out)["spec"]
    assert spec["class"] == "batch"
    assert spec["profiling"] == {"mode": "auto", "windowSeconds": 60}
    assert spec["packing"] == {"policy": "cautious"}


# ---- the life cycle ------------------------------------------------------------------------


def test_share_goes_pending_profiling_packed_with_the_simulated_profile(
    cluster: Any, controller: Any, operator: OperatorProcess, namespace: str
) -> None:
    apply(
        cluster,
        share_manifest(
            "train",
            namespace,
            fraction="0.5",
            selector={"matchLabels": {"app": "train"}},
            profiling={"windowSeconds": 15},
        ),
    )
    # No pod yet: the share is accepted and waits, Pending.
    wait_phase(cluster, "train", namespace, "Pending", timeout_s=30)
    time.sleep(3)
    assert share_status(cluster, "train", namespace)["phase"] == "Pending"

    apply(
        cluster,
        pod_manifest(
            "train-0",
            namespace,
            image=cluster.busybox_image,
            annotations={ANN_FRACTION: "0.5"},
            labels={"app": "train"},
        ),
    )
    profiling = wait_phase(cluster, "train", namespace, "Profiling", timeout_s=60)
    assert profiling["profilingPod"] == "train-0"
    # A governed pod that no node can take stays unbound: it inherits the share's request.
    apply(
        cluster,
        pod_manifest(
            "train-waiting",
            namespace,
            image=cluster.busybox_image,
            annotations={ANN_FRACTION: "0.5"},
            labels={"app": "train"},
            node_selector={"gpushare.io/test": "no-such-node"},
        ),
    )
    packed = wait_phase(cluster, "train", namespace, "Packed", timeout_s=120)

    profiled_pod = get(cluster, "pod", "train-0", namespace)
    ann = profiled_pod["metadata"]["annotations"]
    # A pod keeps its request busy, or its thread cap when that is smaller
    # (gpushare/node/simload.py).
    busy = min(int(ann[ANN_THREAD_PERCENT]), int(ann.get(ANN_REQUEST_PERCENT, "100")))
    profile = packed["profile"]
    assert profile["gpuModel"] == SIMULATED_MODEL
    assert profile["simulated"] is True and profile["source"] == "measured"
    assert profile["sampledSeconds"] >= 10
    # The node agent's simulated load for this pod alone (gpushare.node.simload), averaged over
    # the window: tensor > fp32 > fp16 > fp64, tensor near its busy share.
    expected_tensor = PIPE_WEIGHTS["tensor"] * busy / 100
    assert profile["tensor"] == pytest.approx(expected_tensor, rel=0.25)
    assert profile["tensor"] > profile["fp32"] > profile["fp16"] > profile["fp64"]
    assert ann[ANN_PROFILING] == "done"

    conditions = {c["type"]: c for c in packed["conditions"]}
    assert conditions["Profiled"]["status"] == "True"
    assert conditions["Profiled"]["reason"] == "Measured"
    placed = {p["pod"]: p for p in packed["placements"]}
    assert (
        placed["train-0"]["gpuUuid"]
        == get(cluster, "pod", "train-0", namespace)["metadata"]["annotations"][ANN_GPU_UUID]
    )

    waiting = get(cluster, "pod", "train-waiting", namespace)["metadata"]["annotations"]
    assert waiting[ANN_SHARE] == "train"
    assert waiting[ANN_PACKING_POLICY] == "cautious"
    assert json.loads(waiting["gpushare.io/profile"])["tensor"] == profile["tensor"]

    cache = get(cluster, "configmap", "gpushare-profile-cache", namespace)["data"]
    entries = [json.loads(v) for v in cache.values()]
    assert any(
        e["image"] == cluster.busybox_image and e["gpuModel"] == SIMULATED_MODEL for e in entries
    )

    for reason in ("Accepted", "ProfilingStarted", "Profiled"):
        assert events(cluster, namespace, name="train", reason=reason) == 1, reason
    out = cluster.kubectl("get", "gpushares", "-n", namespace)
    assert out.split()[:7] == ["NAME", "PHASE", "FRACTION", "REQUEST", "CLASS", "POLICY", "PODS"]


def test_deleting_a_namespace_with_a_profiling_share_completes(
    cluster: Any, controller: Any, operator: OperatorProcess, namespace: str
) -> None:
    """A platform engineer deletes a tenant's namespace, GpuShares and all, while the operator
    runs: the operator releases each share (its finalizer) and the namespace goes, even with a
    share mid-profiling whose pod goes at the same time."""
    apply(
        cluster,
        share_manifest(
            "going",
            namespace,
            fraction="0.5",
            selector={"matchLabels": {"app": "going"}},
            profiling={"windowSeconds": 600},
        ),
    )
    apply(
        cluster,
        pod_manifest(
            "going-0",
            namespace,
            image=cluster.busybox_image,
            annotations={ANN_FRACTION: "0.5"},
            labels={"app": "going"},
        ),
    )
    wait_phase(cluster, "going", namespace, "Profiling", timeout_s=60)
    started = time.monotonic()
    cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=90s")
    gone = cluster.kubectl("get", "namespace", namespace, "--ignore-not-found", "-o", "name")
    assert gone.strip() == "", operator.log_text()[-4000:]
    assert time.monotonic() - started < 90


def _env(cluster: Any, namespace: str, name: str) -> dict[str, str]:
    out = cluster.kubectl("exec", "-n", namespace, name, "--", "env")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_a_selector_links_new_labelled_pods_with_the_shares_memory_and_reports_the_rest(
    cluster: Any, controller: Any, operator: OperatorProcess, namespace: str
) -> None:
    """Issue 68: the documented selector governs new pods whatever else they carry (a plain
    pod with the label only, a pod with its own fraction), and each runs with the share's
    memory, the same in its limit annotation, its MPS pinned limit and the CLI. A pod made
    before the share is reported on both; a label added to a running pod moves nothing; a pod
    two selectors match is refused naming both shares."""
    image = cluster.busybox_image
    labels = {"app": "sel"}
    apply(cluster, pod_manifest("early", namespace, image=image, annotations={}, labels=labels))
    apply(cluster, pod_manifest("own", namespace, image=image, annotations={ANN_FRACTION: "0.5"}))
    wait_pod_running(cluster, "early", namespace)
    own_before = wait_pod_running(cluster, "own", namespace)["metadata"]["annotations"]
    selector = {"matchLabels": labels}
    skip = {"mode": "skip"}
    apply(
        cluster,
        share_manifest(
            "sel", namespace, fraction="0.25", memory="6Gi", selector=selector, profiling=skip
        ),
    )
    wait_phase(cluster, "sel", namespace, "Packed", timeout_s=60)
    wait_until(
        lambda: (
            events(cluster, namespace, name="early", reason="SelectorNotLinked") >= 1
            and events(cluster, namespace, name="sel", reason="SelectorNotLinked") >= 1
        ),
        timeout_s=30,
        what="the pod made before the share to be reported on both",
    )
    (said,) = cluster.events(namespace, name="early", reason="SelectorNotLinked")
    assert "Delete the pod so that its controller makes it again" in said["message"]
    cluster.kubectl("label", "pod", "own", "-n", namespace, "app=sel")

    apply(cluster, pod_manifest("plain", namespace, image=image, annotations={}, labels=labels))
    named = {ANN_SHARE: "sel", ANN_FRACTION: "0.5"}
    apply(cluster, pod_manifest("named", namespace, image=image, annotations=named))
    for name, percent in (("plain", "25"), ("named", "50")):
        pod = wait_pod_running(cluster, name, namespace)
        ann = pod["metadata"]["annotations"]
        assert (ann[ANN_SHARE], ann[ANN_MEMORY]) == ("sel", "6Gi"), ann
        assert pod["spec"]["schedulerName"] == "gpushare-scheduler"
        assert pod["spec"]["containers"][0]["resources"]["limits"][RESOURCE_GPU_PERCENT] == percent
        assert int(ann[ANN_MEMORY_LIMIT]) == 6 * 2**30
        assert _env(cluster, namespace, name)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6144M"
    table = subprocess.run(
        [sys.executable, "-m", "gpushare.cli.main", "get", "pods", "-n", namespace],
        capture_output=True, text=True, env=cluster.env, cwd=REPO, timeout=60, check=True,
    ).stdout  # fmt: skip
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:] if line.strip()}
    assert rows["plain"][5] == rows["named"][5] == "6.0Gi", table

    # Labelled while running: the same placement and limits, linked to nothing.
    own = get(cluster, "pod", "own", namespace)["metadata"]["annotations"]
    assert ANN_SHARE not in own
    assert {k: own[k] for k in (ANN_GPU_UUID, ANN_MEMORY_LIMIT, ANN_THREAD_PERCENT)} == {
        k: own_before[k] for k in (ANN_GPU_UUID, ANN_MEMORY_LIMIT, ANN_THREAD_PERCENT)
    }
    assert "own" not in [p["pod"] for p in share_status(cluster, "sel", namespace)["placements"]]

    also = {"matchExpressions": [{"key": "app", "operator": "In", "values": ["sel"]}]}
    apply(
        cluster,
        share_manifest("sel-too", namespace, fraction="0.25", selector=also, profiling=skip),
    )
    wait_phase(cluster, "sel-too", namespace, "Packed", timeout_s=60)
    overlap = wait_until(
        lambda: cluster.events(namespace, name="sel-too", reason="SelectorOverlap"),
        timeout_s=30,
        what="the second share to report the first share's pod its selector matches",
    )
    assert [e["message"].split()[1] for e in overlap] == ["plain"]  # named has no label
    time.sleep(2)  # the controller's GpuShare watch brings sel-too to its webhook
    both = pod_manifest("both", namespace, image=image, annotations={}, labels=labels)
    proc = subprocess.run(
        ["kubectl", "create", "-f", "-"],
        input=json.dumps(both), capture_output=True, text=True, env=cluster.env, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "metadata.labels: match spec.selector of GpuShare sel and GpuShare sel-too" in (
        proc.stderr
    )


def test_fraction_auto_sizes_the_pods_created_once_the_job_is_profiled(
    cluster: Any, controller: Any, operator: OperatorProcess, namespace: str
) -> None:
    apply(
        cluster,
        share_manifest("sized", namespace, fraction="auto", profiling={"windowSeconds": 10}),
    )

    def linked_pod(name: str) -> dict[str, Any]:
        return pod_manifest(
            name, namespace, image=cluster.busybox_image, annotations={ANN_SHARE: "sized"}
        )

    apply(cluster, linked_pod("sized-0"))
    packed = wait_phase(cluster, "sized", namespace, "Packed", timeout_s=120)
    # Sized by the product's rule from the profile it stored (the simulated load is a
    # stand-in with occupancy 0.6: less than a whole GPU).
    percent = suggested_percent(
        pipe_profile(GpuProfile.from_status(packed["profile"])), gpu_class="batch"
    )
    assert 5 <= percent < 100
    assert packed["request"] == as_fraction(percent)
    found = cluster.events(namespace, name="sized", reason="Profiled")
    assert (
        f"fraction auto: pods created from now on ask for {packed['request']}"
        in (found[0]["message"])
    )

    def gpu_percent(name: str) -> str:
        pod = get(cluster, "pod", name, namespace)
        return str(pod["spec"]["containers"][0]["resources"]["limits"][RESOURCE_GPU_PERCENT])

    assert gpu_percent("sized-0") == "100"  # created before the profile: profiled alone
    # The controller's GpuShare watch brings the status to its webhook within moments.
    time.sleep(2)
    apply(cluster, linked_pod("sized-1"))
    assert gpu_percent("sized-1") == str(percent)
    wait_pod_running(cluster, "sized-1", namespace)
    row = cluster.kubectl("get", "gpushare", "sized", "-n", namespace, "--no-headers").split()
    assert row[2:4] == ["auto", packed["request"]]


def test_operator_killed_mid_profiling_resumes_without_repeating_side_effects(
    cluster: Any, controller: Any, operator: OperatorProcess, namespace: str
) -> None:
    apply(
        cluster,
        share_manifest(
            "resume",
            namespace,
            fraction="0.4",
            profiling={"mode": "always", "windowSeconds": 15},
        ),
    )
    apply(
        cluster,
        pod_manifest(
            "resume-0",
            namespace,
            image=cluster.busybox_image,
            annotations={ANN_SHARE: "resume", ANN_FRACTION: "0.4"},
            command=("sh", "-c", "sleep 3600"),
        ),
    )

    def clock_started() -> bool:
        status = share_status(cluster, "resume", namespace)
        return status.get("phase") == "Profiling" and bool(status.get("profilingStarted"))

    wait_until(clock_started, timeout_s=90, what="the profiling clock to start")
    started = share_status(cluster, "resume", namespace)["profilingStarted"]
    operator.kill()
    time.sleep(2)
    operator.start()

    packed = wait_phase(cluster, "resume", namespace, "Packed", timeout_s=120)
    assert packed["profilingStarted"] == started  # the window was not restarted
    assert packed["profile"]["source"] == "measured"
    for reason in ("Accepted", "ProfilingStarted", "Profiled"):
        assert events(cluster, namespace, name="resume", reason=reason) == 1, reason

    # A restart after the share is Packed re-runs no create handler and takes no step.
    operator.kill()
    operator.start()
    time.sleep(5)
    assert share_status(cluster, "resume", namespace)["phase"] == "Packed"
    for reason in ("Accepted", "ProfilingStarted", "Profiled"):
        assert events(cluster, namespace, name="resume", reason=reason) == 1, reason
    meta = get(cluster, "gpushare", "resume", namespace)["metadata"]
    assert "gpushare.io/finalizer" in meta["finalizers"]
    assert "gpushare.io/last-handled-configuration" in meta["annotations"]
    assert not [k for k in meta["annotations"] if k.startswith("gpushare.io/accept")]


def test_second_share_of_the_same_job_reuses_the_cached_profile(
    cluster: Any, controller: Any, operator: OperatorProcess, namespace: str
) -> None:
    command = ("sh", "-c", "sleep 3600 # cached-job")
    apply(
        cluster, share_manifest("first", namespace, fraction="0.3", profiling={"windowSeconds": 10})
    )
    apply(
        cluster,
        pod_manifest(
            "first-0",
            namespace,
            image=cluster.busybox_image,
            command=command,
            annotations={ANN_SHARE: "first", ANN_FRACTION: "0.3"},
        ),
    )
    measured = wait_phase(cluster, "first", namespace, "Packed", timeout_s=120)["profile"]
    cluster.kubectl("delete", "pod", "first-0", "-n", namespace, "--wait=true")

    apply(cluster, share_manifest("second", namespace, fraction="0.3"))
    apply(
        cluster,
        pod_manifest(
            "second-0",
            namespace,
            image=cluster.busybox_image,
            command=command,
            annotations={ANN_SHARE: "second", ANN_FRACTION: "0.3"},
        ),
    )
    reused = wait_phase(cluster, "second", namespace, "Packed", timeout_s=60)["profile"]
    assert reused["source"] == "cache"
    assert reused["tensor"] == measured["tensor"] and reused["time"] == measured["time"]
    assert events(cluster, namespace, name="second", reason="ProfilingStarted") == 0
    assert events(cluster, namespace, name="second", reason="ProfileReused") == 1


# ---- latency protection --------------------------------------------------------------------


def protection_args(threshold: float) -> list[str]:
    """Latency protection made quick for a test: a reading a second over a 2 s window, three
    bad ones in a row to evict, an 8 s cool-down, saturation at ``threshold`` (slowdown
    predictions left out)."""
    return [
        "--protection-interval", "1",
        "--protection-window", "2",
        "--saturation-threshold", f"{threshold:.4f}",
        "--bad-readings", "3",
        "--cooldown", "8",
        "--slowdown-bound", "100",
    ]  # fmt: skip


def test_an_opted_in_pod_runs_beyond_full_gpus_with_the_caps_its_placement_set(
    cluster: Any, controller: Any, operator: OperatorProcess, namespace: str
) -> None:
    """The sharing contract end to end (docs/packing.md): two 60% pods leave no GPU with 60%
    free; a third that opted in runs anyway, beyond a GPU's guaranteed capacity, because the
    node agent advertises gpushare.io/opportunistic-gpu-percent (300 per GPU) and the kubelet
    admits it there; its container runs with the thread and memory caps of its placement."""
    apply(
        cluster,
        share_manifest(
            "train",
            namespace,
            fraction="0.6",
            # Stated, so the memory caps are what the job needs, not 60% of the GPU each:
            # caps never add up to more than the GPU has (the opportunistic pod's included).
            memory="16Gi",
            selector={"matchLabels": {"app": "train"}},
            profiling={"windowSeconds": 15},
        ),
    )

    def train(name: str, **ann: str) -> dict[str, Any]:
        return pod_manifest(
            name,
            namespace,
            image=cluster.busybox_image,
            annotations={ANN_FRACTION: "0.6", **ann},
            labels={"app": "train"},
        )

    # As the chart makes it: the webhook gives opted-in pods this lower priority, so that
    # kube-scheduler's queue tries guaranteed pods first (the controller reads it every 15 s,
    # meanwhile the job is profiled).
    cluster.kubectl("apply", "-f", "-", input=json.dumps(PRIORITY_CLASS))
    try:
        apply(cluster, train("train-0"))
        # Opportunistic placement needs the job's measured profile.
        wait_phase(cluster, "train", namespace, "Packed", timeout_s=150)
        apply(cluster, train("train-1"))
        first, _ = _gpu_and_threads(cluster, "train-0", namespace)
        second, _ = _gpu_and_threads(cluster, "train-1", namespace)
        assert first != second, "the two 60% pods should each hold a GPU's guaranteed 60%"

        opted_in = train("train-2", **{ANN_OPPORTUNISTIC: "true"})

        def given_priority() -> bool:
            dry = cluster.kubectl(
                "create", "--dry-run=server", "-o", "json", "-n", namespace, "-f", "-",
                input=json.dumps(opted_in),
            )  # fmt: skip
            return bool(json.loads(dry)["spec"].get("priority") == OPPORTUNISTIC_PRIORITY)

        wait_until(given_priority, timeout_s=60, what="the webhook to give the PriorityClass")
        apply(cluster, opted_in)
        running = wait_pod_running(cluster, "train-2", namespace, timeout_s=120)
    finally:
        cluster.kubectl(
            "delete", "priorityclass", PRIORITY_CLASS["metadata"]["name"], "--ignore-not-found"
        )
    spec = running["spec"]
    assert (spec["priorityClassName"], spec["priority"], spec["preemptionPolicy"]) == (
        "gpushare-opportunistic",
        OPPORTUNISTIC_PRIORITY,
        "Never",
    )
    ann = running["metadata"]["annotations"]
    limits = running["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {RESOURCE_GPU_OPPORTUNISTIC: "60"}
    assert ann[ANN_TIER] == TIER_OPPORTUNISTIC
    assert ann[ANN_GPU_UUID] in (first, second)
    assert ann[ANN_STATE] == STATE_ALLOCATED
    env = dict(
        line.split("=", 1)
        for line in cluster.kubectl("exec", "-n", namespace, "train-2", "--", "env").splitlines()
        if "=" in line
    )
    assert env["CUDA_VISIBLE_DEVICES"] == ann[ANN_GPU_UUID]
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == ann[ANN_THREAD_PERCENT]
    assert int(ann[ANN_MEMORY_LIMIT]) == 16 * 2**30
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=16384M"
    node = json.loads(cluster.kubectl("get", "node", cluster.node_name, "-o", "json"))
    assert node["status"]["allocatable"][RESOURCE_GPU_OPPORTUNISTIC] == "600"


def test_an_opportunistic_pod_is_paused_for_a_guaranteed_pod_and_resumed_when_it_leaves(
    cluster: Any,
    controller: Any,
    operator: OperatorProcess,
    node_agent: NodeAgentProcess,
    namespace: str,
) -> None:
    """Pause, don't kill (issue 65), end to end on the local cluster: a guaranteed pod whose
    class bound the running opportunistic pod would break (the simulated profiles are a
    saturating mix, every pod capped at its share: uncapped, the model would hold the three
    to the work the SM time they leave idle allows, 1.7x each, docs/packing.md "Work
    conservation") is bound beside it after the controller wrote gpushare.io/pause on it,
    naming the guaranteed pod, with a Paused Event; the node agent freezes it
    (gpushare.io/paused for that request); it is not evicted. Once the guaranteed pod is
    deleted, the controller removes the request (a Resumed Event) and the agent thaws it.
    (How a frozen pod's work and probes fare: tests/cluster/test_pause_cluster.py.)"""
    blocked, train = _one_gpu_for_capped_training(cluster, namespace)
    apply(cluster, train("train-0"))
    wait_phase(cluster, "train", namespace, "Packed", timeout_s=150)
    # The share is profiled. Its guaranteed neighbour is a pod outside it, without a profile:
    # two profiled saturating pods are a pair an opportunistic pod may not make (it would
    # take the guaranteed one below what its share alone gives it: packing.share_floor).
    cluster.kubectl("delete", "pod", "train-0", "-n", namespace, "--wait=true")
    apply(cluster, train("holder", share=False))
    wait_pod_running(cluster, "holder", namespace, timeout_s=120)
    apply(cluster, train("train-1", **{ANN_OPPORTUNISTIC: "true"}))
    opportunistic = wait_pod_running(cluster, "train-1", namespace, timeout_s=120)
    shared = opportunistic["metadata"]["annotations"][ANN_GPU_UUID]
    assert opportunistic["metadata"]["annotations"][ANN_TIER] == TIER_OPPORTUNISTIC
    assert shared != blocked

    apply(cluster, train("needs-room", "0.4"))
    guaranteed = wait_pod_running(cluster, "needs-room", namespace, timeout_s=120)
    assert guaranteed["metadata"]["annotations"][ANN_GPU_UUID] == shared
    paused = get(cluster, "pod", "train-1", namespace)
    request = load_pause_request(paused["metadata"]["annotations"][ANN_PAUSE])
    assert request.reason == REASON_GUARANTEED
    assert request.for_pods == (f"{namespace}/needs-room",)
    # Asked before the guaranteed pod was bound (the request's time is whole seconds).
    bound_at = parse_rfc3339(guaranteed["metadata"]["annotations"][ANN_BIND_TIME], field="t")
    assert parse_rfc3339(request.since, field="t") <= bound_at
    wait_until(
        lambda: events(cluster, namespace, name="train-1", reason="Paused") >= 1,
        timeout_s=30,
        what="the Paused Event",
    )
    frozen = wait_until(
        lambda: get(cluster, "pod", "train-1", namespace)["metadata"]["annotations"].get(
            ANN_PAUSED
        ),
        timeout_s=30,
        what="the node agent to report the freeze",
    )
    assert load_pause_state(frozen).request_since == request.since
    assert paused["status"]["phase"] == "Running"
    assert events(cluster, namespace, name="train-1", reason="Preempted") == 0

    cluster.kubectl("delete", "pod", "needs-room", "-n", namespace, "--wait=true")
    wait_until(
        lambda: (
            ANN_PAUSE not in get(cluster, "pod", "train-1", namespace)["metadata"]["annotations"]
        ),
        timeout_s=30,
        what="the pause request to be removed",
    )
    wait_until(
        lambda: events(cluster, namespace, name="train-1", reason="Resumed") >= 1,
        timeout_s=30,
        what="the Resumed Event",
    )
    wait_until(
        lambda: (
            ANN_PAUSED not in get(cluster, "pod", "train-1", namespace)["metadata"]["annotations"]
        ),
        timeout_s=30,
        what="the node agent to thaw it",
    )
    after = get(cluster, "pod", "train-1", namespace)
    assert after["status"]["phase"] == "Running"
    assert all(s.get("restartCount", 0) == 0 for s in after["status"]["containerStatuses"])


def test_a_guaranteed_pod_that_waited_longer_gets_the_room_before_an_opted_in_one_is_promoted(
    cluster: Any,
    controller: Any,
    operator: OperatorProcess,
    node_agent: NodeAgentProcess,
    namespace: str,
) -> None:
    """Opting in never jumps the queue (docs/packing.md, "The sharing contract"), end to end
    with the real kube-scheduler retrying the pod: a guaranteed pod refused for room before
    an opted-in pod was placed beside the GPU's guaranteed tenant (a pod without a profile)
    gets that tenant's room when it leaves; the opted-in pod is not promoted into it and
    runs on beside it, or paused, never evicted or restarted. On this quiet cluster the
    scheduler's retry mostly comes before the leader's promotion round anyway; the rule that
    decides the race when it does not is pinned by
    tests/unit/cluster/test_opportunistic_pausing.py."""
    blocked, train = _one_gpu_for_capped_training(cluster, namespace)
    apply(cluster, train("train-0"))
    wait_phase(cluster, "train", namespace, "Packed", timeout_s=150)
    # The GPU's guaranteed tenant is a pod outside the share, without a profile (beside a
    # profiled one, packing.share_floor keeps the opted-in pod off the GPU).
    cluster.kubectl("delete", "pod", "train-0", "-n", namespace, "--wait=true")
    apply(cluster, train("holder", share=False))
    shared, _ = _gpu_and_threads(cluster, "holder", namespace)
    assert shared != blocked
    # 50% does not fit beside 60%: the filter refuses it, and it waits.
    apply(cluster, train("waits", "0.5"))
    wait_until(
        lambda: events(cluster, namespace, name="waits", reason="FailedScheduling") >= 1,
        timeout_s=60,
        what="the waiting pod to be refused for room",
    )
    apply(cluster, train("opted-in", **{ANN_OPPORTUNISTIC: "true"}))
    opted = wait_pod_running(cluster, "opted-in", namespace, timeout_s=120)
    assert opted["metadata"]["annotations"][ANN_TIER] == TIER_OPPORTUNISTIC
    assert opted["metadata"]["annotations"][ANN_GPU_UUID] == shared

    cluster.kubectl("delete", "pod", "holder", "-n", namespace, "--wait=true")
    placed = wait_pod_running(cluster, "waits", namespace, timeout_s=120)
    assert placed["metadata"]["annotations"][ANN_GPU_UUID] == shared
    assert placed["metadata"]["annotations"].get(ANN_TIER, TIER_GUARANTEED) == TIER_GUARANTEED
    after = get(cluster, "pod", "opted-in", namespace)
    assert after["metadata"]["annotations"][ANN_TIER] == TIER_OPPORTUNISTIC
    assert events(cluster, namespace, name="opted-in", reason="Promoted") == 0
    assert events(cluster, namespace, name="opted-in", reason="Preempted") == 0
    assert after["status"]["phase"] == "Running"
    assert all(s.get("restartCount", 0) == 0 for s in after["status"]["containerStatuses"])


def _one_gpu_for_capped_training(
    cluster: Any, namespace: str
) -> tuple[str, Callable[..., dict[str, Any]]]:
    """One GPU held whole by a pod named blocker (its UUID is returned), so the rest of a test
    shares the other, and a GpuShare "train" (60%, profiled over 15 s) with a maker of its
    pods: ``train(name, fraction="0.6", **annotations)``; ``train(name, share=False)`` makes
    the same pod outside the share, without a profile. Each pod has a memory cap of its own,
    so that memory never stands in the way, only compute does (what needs memory is evicted:
    tests/unit/cluster/test_opportunistic_pausing.py), and a thread cap at its share, so that
    such pods together are predicted past the batch bound."""
    image = cluster.busybox_image
    apply(cluster, pod_manifest("blocker", namespace, image=image, annotations={ANN_FRACTION: "1"}))
    blocked, _ = _gpu_and_threads(cluster, "blocker", namespace)
    apply(
        cluster,
        share_manifest(
            "train",
            namespace,
            fraction="0.6",
            memory="16Gi",
            selector={"matchLabels": {"app": "train"}},
            profiling={"windowSeconds": 15},
        ),
    )

    def train(
        name: str, fraction: str = "0.6", *, share: bool = True, **ann: str
    ) -> dict[str, Any]:
        return pod_manifest(
            name,
            namespace,
            image=image,
            annotations={ANN_FRACTION: fraction, ANN_LIMIT: fraction, ANN_MEMORY: "8Gi", **ann},
            labels={"app": "train"} if share else {},
        )

    return blocked, train


def _gpu_and_threads(cluster: Any, name: str, namespace: str) -> tuple[str, int]:
    ann = wait_pod_running(cluster, name, namespace)["metadata"]["annotations"]
    return ann[ANN_GPU_UUID], int(ann[ANN_THREAD_PERCENT])


def test_saturated_gpu_of_a_latency_pod_evicts_its_newest_batch_pod(
    cluster: Any,
    controller: Any,
    node_agent: NodeAgentProcess,
    namespace: str,
    tmp_path: Path,
) -> None:
    image = cluster.busybox_image

    def pod(name: str, fraction: str, cls: str, **ann: str) -> dict[str, Any]:
        return pod_manifest(
            name,
            namespace,
            image=image,
            labels={"app": name},
            annotations={ANN_FRACTION: fraction, ANN_CLASS: cls, **ann},
        )

    # Fill one GPU entirely, so every other pod lands on the other one.
    apply(cluster, pod("blocker", "1", "batch"))
    blocked_gpu, _ = _gpu_and_threads(cluster, "blocker", namespace)
    apply(
        cluster,
        share_manifest(
            "infer", namespace, fraction="0.3", **{"class": "latency"}, profiling={"mode": "skip"}
        ),
    )
    apply(cluster, pod("infer", "0.3", "latency", **{ANN_SHARE: "infer"}))
    gpu, infer_threads = _gpu_and_threads(cluster, "infer", namespace)
    assert gpu != blocked_gpu
    apply(cluster, pod("train-a", "0.4", "batch"))
    gpu_a, threads_a = _gpu_and_threads(cluster, "train-a", namespace)
    apply(cluster, pod("train-b", "0.3", "batch"))
    gpu_b, threads_b = _gpu_and_threads(cluster, "train-b", namespace)
    assert gpu_a == gpu_b == gpu, "pods did not share the latency pod's GPU"

    # The simulated GPU's busiest pipe follows the threads placed on it (gpushare.node.simload);
    # saturation is set between the load without and with the newest batch pod.
    # A pod counts its thread percentage, or its guaranteed share when smaller (the latency
    # pod runs uncapped on a 30 % share).
    weight = PIPE_WEIGHTS["tensor"]
    infer_busy, a_busy, b_busy = min(infer_threads, 30), min(threads_a, 40), min(threads_b, 30)
    before = weight * min(1.0, (infer_busy + a_busy) / 100)
    after = weight * min(1.0, (infer_busy + a_busy + b_busy) / 100)
    assert after > before
    threshold = (before + after) / 2
    guard = OperatorProcess(
        cluster=cluster,
        namespace=namespace,
        agent_url=f"http://127.0.0.1:{node_agent.metrics_port}",
        log_path=tmp_path / "operator.log",
        args=protection_args(threshold),
    )
    # The newest batch pod is covered by a PodDisruptionBudget at first.
    apply(
        cluster,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "keep-train-b", "namespace": namespace},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train-b"}}},
        },
    )
    guard.start()
    try:
        # The PDB is respected: the eviction is refused, reported once, and retried.
        wait_until(
            lambda: events(cluster, namespace, name="train-b", reason="EvictionBlocked") >= 1,
            timeout_s=60,
            what="the PodDisruptionBudget to block the eviction",
        )
        time.sleep(5)
        assert get(cluster, "pod", "train-b", namespace)["status"]["phase"] == "Running"
        assert events(cluster, namespace, name="train-b", reason="EvictionBlocked") == 1
        assert events(cluster, namespace, name="train-a", reason="EvictionBlocked") == 0

        cluster.kubectl("delete", "pdb", "keep-train-b", "-n", namespace)
        wait_until(
            lambda: (
                pod_gone(cluster, "train-b", namespace)
                or get(cluster, "pod", "train-b", namespace)["metadata"].get("deletionTimestamp")
            ),
            timeout_s=60,
            what="the newest batch pod to be evicted once the PDB is gone",
        )
        assert events(cluster, namespace, name="train-b", reason="EvictedForLatency") == 1
        assert events(cluster, namespace, name="infer", reason="NeighbourEvicted") >= 1
        status = share_status(cluster, "infer", namespace)
        assert status["evictions"] == 1
        condition = {c["type"]: c for c in status["conditions"]}["NeighbourEvicted"]
        assert condition["status"] == "True" and "train-b" in condition["message"]

        # Below the threshold again: the older batch pod and the latency pod stay.
        time.sleep(15)
        for name in ("infer", "train-a"):
            assert get(cluster, "pod", name, namespace)["status"]["phase"] == "Running", name
        assert events(cluster, namespace, name="train-a", reason="EvictedForLatency") == 0
        assert share_status(cluster, "infer", namespace)["evictions"] == 1
    finally:
        guard.stop()
