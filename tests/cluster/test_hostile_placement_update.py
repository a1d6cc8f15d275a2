"""The chart's ValidatingAdmissionPolicy on the real API server: a user allowed to patch their
own pod cannot rewrite its placement annotations, the node agent's ServiceAccount still can,
and a Binding (how gpushare-scheduler's binds write them) is not affected.

The policy and its binding are rendered from the chart by `helm template` under a throwaway
release whose namespace is the test's own, and bound to that namespace only (the chart's
``placementGuard.namespaceSelector``), so other tests on the shared cluster never meet it.
ServiceAccounts are impersonated with ``kubectl --as``.
"""

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpushare.api.gpushare_crd import ANN_PACKING_POLICY, ANN_PROFILING
from gpushare.api.names import (
    ANN_BIND_TIME,
    ANN_FRACTION,
    ANN_GPU_UUID,
    ANN_PAUSE,
    ANN_PAUSED,
    ANN_STATE,
    ANN_THREAD_PERCENT,
)
from gpushare.api.pause import PauseRequest
from tests.fixtures.helm_chart import CHART, KUBE_VERSION, helm_binary

pytestmark = pytest.mark.cluster

GPU = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
OTHER_GPU = "GPU-bbbbbbbb-1111-2222-3333-444444444444"


def run_kubectl(
    cluster: Any, *args: str, user: str | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = ["kubectl", *args, *([f"--as={user}"] if user else [])]
    return subprocess.run(
        cmd, input=stdin, capture_output=True, text=True, env=cluster.env, timeout=60, check=False
    )


def pod_manifest(name: str, scheduler: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                # Never scheduled here: no scheduler by that name runs.
                "schedulerName": scheduler,
                "containers": [{"name": "c", "image": "busybox", "command": ["true"]}],
            },
        }
    )


@pytest.fixture
def guarded(cluster: Any) -> Iterator[dict[str, str]]:
    helm = helm_binary()
    if helm is None:
        pytest.skip("helm not found: build it with `hack/build-tools.sh helm`")
    suffix = uuid.uuid4().hex[:6]
    namespace, release = f"gs-vap-{suffix}", f"gsvap{suffix}"
    rendered = subprocess.run(
        [
            helm,
            "template",
            release,
            str(CHART),
            "--namespace",
            namespace,
            "--kube-version",
            KUBE_VERSION,
            "--show-only",
            "templates/placement-policy.yaml",
            # --set-string: a suffix of hex digits only ("380144") would be read as a number.
            "--set-string",
            f"placementGuard.namespaceSelector.matchLabels.gpushare-vap-test={suffix}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert [d["kind"] for d in docs] == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    names = {
        "namespace": namespace,
        "agent": f"system:serviceaccount:{namespace}:{release}-gpushare-node-agent",
        "user": f"system:serviceaccount:{namespace}:someone",
    }
    cluster.kubectl("create", "namespace", namespace)
    try:
        cluster.kubectl("label", "namespace", namespace, f"gpushare-vap-test={suffix}")
        for sa in (f"{release}-gpushare-node-agent", "someone"):
            cluster.kubectl("create", "serviceaccount", "-n", namespace, sa)
        # Both may patch pods and create Bindings here: RBAC lets them, only the policy decides.
        cluster.kubectl(
            "create", "role", "-n", namespace, "pods", "--verb=get,patch,update",
            "--resource=pods", "--resource=pods/status", "--verb=create",
            "--resource=pods/binding",
        )  # fmt: skip
        cluster.kubectl(
            "create", "rolebinding", "-n", namespace, "pods", "--role=pods",
            f"--serviceaccount={namespace}:someone",
            f"--serviceaccount={namespace}:{release}-gpushare-node-agent",
        )  # fmt: skip
        # A pod placed before the policy exists (the webhook refuses these keys on CREATE).
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=pod_manifest("p", "nobody"))
        cluster.kubectl(
            "annotate", "-n", namespace, "pod", "p",
            f"{ANN_GPU_UUID}={GPU}", f"{ANN_THREAD_PERCENT}=25",
            f"{ANN_BIND_TIME}=2026-11-01T12:00:00.000000Z", f"{ANN_STATE}=assumed",
            f"{ANN_FRACTION}=0.9",
        )  # fmt: skip
        cluster.kubectl("apply", "-f", "-", input=rendered)
        yield names
    finally:
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=rendered, check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def annotate(
    cluster: Any, names: dict[str, str], user: str, *pairs: str
) -> subprocess.CompletedProcess[str]:
    return run_kubectl(
        cluster, "annotate", "--overwrite", "-n", names["namespace"], "pod", "p", *pairs,
        user=names[user],
    )  # fmt: skip


def annotations(cluster: Any, names: dict[str, str], pod: str = "p") -> dict[str, str]:
    out = cluster.kubectl("get", "pod", "-n", names["namespace"], pod, "-o", "json")
    return dict(json.loads(out)["metadata"].get("annotations") or {})


def test_a_user_cannot_rewrite_placement_but_the_node_agent_can(
    cluster: Any, guarded: dict[str, str]
) -> None:
    # The policy takes a moment to reach the API server's admission chain.
    deadline = time.monotonic() + 60
    refused = annotate(cluster, guarded, "user", f"{ANN_GPU_UUID}={OTHER_GPU}")
    while refused.returncode == 0 and time.monotonic() < deadline:
        annotate(cluster, guarded, "agent", f"{ANN_GPU_UUID}={GPU}")  # undo
        time.sleep(1)
        refused = annotate(cluster, guarded, "user", f"{ANN_GPU_UUID}={OTHER_GPU}")
    assert refused.returncode != 0, "a user rewrote gpushare.io/gpu-uuid"
    assert f"metadata.annotations[{ANN_GPU_UUID}]" in refused.stderr, refused.stderr
    assert "fix:" in refused.stderr, refused.stderr
    assert annotations(cluster, guarded)[ANN_GPU_UUID] == GPU

    # Raising the thread share, or dropping the state, is refused the same way.
    for change in (f"{ANN_THREAD_PERCENT}=100", f"{ANN_STATE}-"):
        answer = annotate(cluster, guarded, "user", change)
        assert answer.returncode != 0 and "metadata.annotations[gpushare.io/" in answer.stderr
    # Other annotations stay the user's own.
    assert annotate(cluster, guarded, "user", "team/owner=alice").returncode == 0

    # The node agent's allocated mark goes through.
    marked = annotate(cluster, guarded, "agent", f"{ANN_STATE}=allocated")
    assert marked.returncode == 0, marked.stderr
    now = annotations(cluster, guarded)
    assert (now[ANN_STATE], now[ANN_THREAD_PERCENT], now["team/owner"]) == (
        "allocated",
        "25",
        "alice",
    )


def test_a_binding_carrying_placement_annotations_is_not_refused(
    cluster: Any, guarded: dict[str, str]
) -> None:
    """gpushare-scheduler's extender binds through pods/binding, whose annotations the API
    server copies onto the pod without a pod UPDATE admission: the policy must not (and does
    not) stand in the way, whoever binds. Checked after the policy refuses a plain update."""
    deadline = time.monotonic() + 60
    while annotate(cluster, guarded, "user", f"{ANN_THREAD_PERCENT}=99").returncode == 0:
        annotate(cluster, guarded, "agent", f"{ANN_THREAD_PERCENT}=25")
        assert time.monotonic() < deadline, "the policy never took effect"
        time.sleep(1)
    namespace = guarded["namespace"]
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=pod_manifest("q", "nobody"))
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": "q",
            "annotations": {ANN_GPU_UUID: GPU, ANN_THREAD_PERCENT: "10", ANN_STATE: "assumed"},
        },
        # A node that does not exist: the pod stays Pending and takes nothing from the node.
        "target": {"apiVersion": "v1", "kind": "Node", "name": "gs-vap-nowhere"},
    }
    bound = run_kubectl(
        cluster,
        "create",
        "--raw",
        f"/api/v1/namespaces/{namespace}/pods/q/binding",
        "-f",
        "-",
        user=guarded["user"],
        stdin=json.dumps(binding),
    )
    assert bound.returncode == 0, bound.stderr
    now = annotations(cluster, guarded, "q")
    assert (now[ANN_GPU_UUID], now[ANN_THREAD_PERCENT]) == (GPU, "10")


def test_a_user_cannot_shrink_its_request_or_claim_neighbour_rules_even_through_status(
    cluster: Any, guarded: dict[str, str]
) -> None:
    """A running 90 % pod patching gpu-fraction to 0.01 would make its GPU count as 1 % used;
    claiming packing-policy exclusive or profiling would keep others off its GPU. Refused on
    the pod and on pods/status (annotations change through both)."""
    deadline = time.monotonic() + 60
    while annotate(cluster, guarded, "user", f"{ANN_FRACTION}=0.01").returncode == 0:
        annotate(cluster, guarded, "agent", f"{ANN_FRACTION}=0.9")  # undo
        assert time.monotonic() < deadline, "the policy never took effect"
        time.sleep(1)
    for change in (f"{ANN_PACKING_POLICY}=exclusive", f"{ANN_PROFILING}=true", "gpushare.io/x=1"):
        answer = annotate(cluster, guarded, "user", change)
        assert answer.returncode != 0, f"a user set {change}"
        assert "metadata.annotations[gpushare.io/" in answer.stderr, answer.stderr
    status_patch = json.dumps({"metadata": {"annotations": {ANN_FRACTION: "0.01"}}})
    through_status = run_kubectl(
        cluster, "patch", "pod", "p", "-n", guarded["namespace"], "--subresource=status",
        "--type=merge", "-p", status_patch, user=guarded["user"],
    )  # fmt: skip
    assert through_status.returncode != 0, "a user changed gpu-fraction through pods/status"
    assert f"metadata.annotations[{ANN_FRACTION}]" in through_status.stderr
    assert annotations(cluster, guarded)[ANN_FRACTION] == "0.9"


def test_a_user_can_neither_pause_nor_resume_a_pod(cluster: Any, guarded: dict[str, str]) -> None:
    """gpushare.io/pause (the controller's request) and gpushare.io/paused (the node agent's
    record) are gpushare's like the placement (issue 65): a tenant who could write them would
    pause pods of its namespace as it likes, or resume its own pod that gpushare paused for a
    guaranteed one. The node agent's ServiceAccount writes its record."""
    deadline = time.monotonic() + 60
    while annotate(cluster, guarded, "user", f"{ANN_THREAD_PERCENT}=99").returncode == 0:
        annotate(cluster, guarded, "agent", f"{ANN_THREAD_PERCENT}=25")  # undo
        assert time.monotonic() < deadline, "the policy never took effect"
        time.sleep(1)
    request = PauseRequest(reason="harm", message="measured", since="2026-11-27T10:00:00Z")
    asked = annotate(cluster, guarded, "user", f"{ANN_PAUSE}={request.dump()}")
    assert asked.returncode != 0, "a user paused a pod"
    assert f"metadata.annotations[{ANN_PAUSE}]" in asked.stderr, asked.stderr
    # Paused by gpushare (written here as the agent's ServiceAccount, which the policy lets
    # through like the controller's): the tenant can take away neither.
    record = '{"requestSince":"2026-11-27T10:00:00Z","since":"2026-11-27T10:00:01Z"}'
    written = annotate(
        cluster, guarded, "agent", f"{ANN_PAUSE}={request.dump()}", f"{ANN_PAUSED}={record}"
    )
    assert written.returncode == 0, written.stderr
    for change in (f"{ANN_PAUSE}-", f"{ANN_PAUSED}-"):
        answer = annotate(cluster, guarded, "user", change)
        assert answer.returncode != 0, f"a user resumed a pod ({change})"
        assert "metadata.annotations[gpushare.io/paus" in answer.stderr, answer.stderr
    now = annotations(cluster, guarded)
    assert (now[ANN_PAUSE], now[ANN_PAUSED]) == (request.dump(), record)
