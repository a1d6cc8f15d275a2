"""A hostile tenant against the real cluster: every attack of the tenant-safety issue and more,
each refused with a clear reason, none disturbing a victim pod of another namespace.

The tenant is a ServiceAccount of its own namespace (impersonated with ``kubectl --as``) that
may create, patch and update its pods and their status, as namespace owners usually may; it can
reach the extender's port (the local cluster's gpushare-scheduler calls it over plain HTTP on
this host, so the network check is skipped here: the chart's NetworkPolicy and mutual TLS are
the first fences, checked in tests/chart and by ``test_extender_without_client_certificate``).
The chart's two ValidatingAdmissionPolicies (placement annotations; node agents confined to
their node) are rendered by helm and bound to this module's namespaces; the host-process
controller and node agent of the test harness write as ``kubernetes-admin``, which the policy
names as a writer (in a chart install they are the release's ServiceAccounts). The attacks on
the node agents' Leases also act with tokens of the agent's ServiceAccount under the chart's
own RBAC, and SIGKILL the test node agent where the attack needs a dead one (a new one is
started before the next attack).

Results: $GPUSHARE_SECURITY_OUT/attacks.json (else the cluster state dir), for
bench/results/security.json.
"""

import contextlib
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.api.agent_lease import agent_lease_name
from gpushare.api.gpushare_crd import ANN_PACKING_POLICY, ANN_PROFILE, ANN_PROFILING
from gpushare.api.names import (
    ANN_BIND_TIME,
    ANN_CLASS,
    ANN_CONTAINER,
    ANN_FRACTION,
    ANN_GPU_UUID,
    ANN_MEMORY,
    ANN_OPPORTUNISTIC,
    ANN_REQUEST_PERCENT,
    ANN_SHARE,
    ANN_STATE,
    ANN_THREAD_PERCENT,
    ANN_TIER,
    LABEL_NEIGHBOUR_RULES,
    LABEL_SHARING_GROUP,
    NVIDIA_GPU_RESOURCE,
    RESOURCE_GPU_OPPORTUNISTIC,
    RESOURCE_GPU_PERCENT,
    SCHEDULER_NAME,
)
from tests.faults.cluster_checks import kubectl_json, sigkill, wait_until
from tests.fixtures.controller import AGENT_LEASE_MAX_SECONDS, EXTENDER_PORT, ControllerProcess
from tests.fixtures.helm_chart import CHART, KUBE_VERSION, helm_binary
from tests.fixtures.node_agent import NodeAgentProcess, find_agent, scraper_token

pytestmark = pytest.mark.cluster

ADMIN = "kubernetes-admin"
EXTENDER = f"http://127.0.0.1:{EXTENDER_PORT}/scheduler"
RESULTS: dict[str, dict[str, Any]] = {}


@dataclass
class Sec:
    cluster: Any
    controller: ControllerProcess
    agent: NodeAgentProcess
    victim_ns: str
    attacker_ns: str
    agent_ns: str
    release: str
    tenant: str
    victim: dict[str, Any] = field(default_factory=dict)

    def kubectl(self, *args: str, as_tenant: bool = False, stdin: str | None = None) -> Any:
        cmd = ["kubectl", *args, *([f"--as={self.tenant}"] if as_tenant else [])]
        return subprocess.run(
            cmd,
            input=stdin,
            capture_output=True,
            text=True,
            env=self.cluster.env,
            timeout=90,
            check=False,
        )

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(kubectl_json(self.cluster, "get", "pod", name, "-n", namespace))


def pod_doc(
    name: str,
    image: str,
    *,
    annotations: dict[str, str] | None = None,
    command: str = "sleep 3600",
    spec: dict[str, Any] | None = None,
    container: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", command],
                    **(container or {}),
                }
            ],
            **(spec or {}),
        },
    }


def running(sec: Sec, namespace: str, name: str, timeout_s: float = 90) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        pod = sec.pod(namespace, name)
        return pod if pod["status"].get("phase") == "Running" else None

    found = wait_until(ready, timeout_s=timeout_s)
    assert found, f"{namespace}/{name} never ran: {sec.pod(namespace, name)['status']}"
    return dict(found)


def scheduling_message(sec: Sec, namespace: str, name: str, timeout_s: float = 60) -> str:
    def message() -> str:
        events = sec.cluster.events(namespace, name=name, reason="FailedScheduling")
        return " | ".join(str(e.get("message")) for e in events)

    return str(wait_until(message, timeout_s=timeout_s) or "")


def victim_state(sec: Sec) -> tuple[Any, ...]:
    pod = sec.pod(sec.victim_ns, "victim")
    status = pod["status"]["containerStatuses"][0]
    ann = pod["metadata"]["annotations"]
    return (
        pod["metadata"]["uid"],
        pod["status"]["phase"],
        status["containerID"],
        status["restartCount"],
        ann.get(ANN_GPU_UUID),
        ann.get(ANN_THREAD_PERCENT),
        ann.get(ANN_FRACTION),
    )


@pytest.fixture(scope="module")
def sec(cluster: Any, controller: ControllerProcess, node_agent: NodeAgentProcess) -> Iterator[Sec]:
    helm = helm_binary()
    if helm is None:
        pytest.skip("helm not found: build it with `hack/build-tools.sh helm`")
    sfx = uuid.uuid4().hex[:6]
    s = Sec(
        cluster,
        controller,
        node_agent,
        victim_ns=f"gs-sec-victim-{sfx}",
        attacker_ns=f"gs-sec-tenant-{sfx}",
        agent_ns=f"gs-sec-agent-{sfx}",
        release=f"gssec{sfx}",
        tenant=f"system:serviceaccount:gs-sec-tenant-{sfx}:tenant",
    )
    rendered = subprocess.run(
        [
            helm,
            "template",
            s.release,
            str(CHART),
            "--namespace",
            s.agent_ns,
            "--kube-version",
            KUBE_VERSION,
            "--show-only",
            "templates/placement-policy.yaml",
            "--show-only",
            "templates/node-agent-guard.yaml",
            "--show-only",
            "templates/host-path-policy.yaml",
            "--set-string",
            f"hostPathGuard.namespaceSelector.matchLabels.gs-sec={sfx}",
            # An admin's strict choice (NOTES warns about it): other pods refused too.
            "--set",
            "hostPathGuard.otherPods=deny",
            "--set-string",
            f"placementGuard.namespaceSelector.matchLabels.gs-sec={sfx}",
            "--set-string",
            f"placementGuard.extraWriters[0]={ADMIN}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for ns in (s.victim_ns, s.attacker_ns, s.agent_ns):
        cluster.kubectl("create", "namespace", ns)
        cluster.kubectl("label", "namespace", ns, controller.namespace_label, f"gs-sec={sfx}")
    try:
        cluster.kubectl("create", "serviceaccount", "-n", s.attacker_ns, "tenant")
        cluster.kubectl(
            "create",
            "role",
            "-n",
            s.attacker_ns,
            "owner",
            "--verb=get,list,watch,create,patch,update,delete",
            "--resource=pods",
            "--resource=pods/status",
        )
        cluster.kubectl(
            "create",
            "rolebinding",
            "-n",
            s.attacker_ns,
            "owner",
            "--role=owner",
            f"--serviceaccount={s.attacker_ns}:tenant",
        )
        cluster.kubectl("apply", "-f", "-", input=rendered)
        victim = pod_doc("victim", cluster.busybox_image, annotations={ANN_FRACTION: "0.3"})
        cluster.kubectl("apply", "-n", s.victim_ns, "-f", "-", input=json.dumps(victim))
        s.victim = running(s, s.victim_ns, "victim")
        yield s
    finally:
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=rendered, check=False)
        for ns in (s.victim_ns, s.attacker_ns, s.agent_ns):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        out = Path(os.environ.get("GPUSHARE_SECURITY_OUT") or Path(cluster.state_dir) / "security")
        out.mkdir(parents=True, exist_ok=True)
        (out / "attacks.json").write_text(json.dumps(RESULTS, indent=2, sort_keys=True))


def post(path: str, body: Any, *, raw: bytes | None = None) -> tuple[int, dict[str, Any] | str]:
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{EXTENDER}/{path}", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


# ---- the attacks ---------------------------------------------------------------------------

Outcome = tuple[bool, str]
"""(refused, the reason the cluster gave)."""


def create(sec: Sec, doc: dict[str, Any]) -> Outcome:
    out = sec.kubectl(
        "create", "-n", sec.attacker_ns, "-f", "-", as_tenant=True, stdin=json.dumps(doc)
    )
    return out.returncode != 0, out.stderr.strip()


def forged_bind(sec: Sec, namespace: str, name: str, expect: str) -> Outcome:
    """POST /scheduler/bind for an existing pending pod to this node, as any caller that
    reaches the extender could; refused when the pod stays unbound and the answer says
    ``expect``."""
    uid = sec.pod(namespace, name)["metadata"]["uid"]
    body = {"PodName": name, "PodNamespace": namespace, "PodUID": uid}
    _, answer = post("bind", {**body, "Node": sec.cluster.node_name})
    bound = sec.pod(namespace, name)["spec"].get("nodeName")
    error = answer.get("Error", "") if isinstance(answer, dict) else answer
    return not bound and expect in error, error


def a_forged_bind_of_a_pod_of_another_scheduler(sec: Sec) -> Outcome:
    """Issue: a POST to /scheduler/bind bound kube-system/victim to an attacker's node."""
    name = f"plain-{uuid.uuid4().hex[:4]}"
    doc = pod_doc(name, sec.cluster.busybox_image, spec={"schedulerName": "nobody"})
    sec.cluster.kubectl("apply", "-n", sec.victim_ns, "-f", "-", input=json.dumps(doc))
    try:
        return forged_bind(sec, sec.victim_ns, name, "not gpushare-scheduler")
    finally:
        sec.cluster.kubectl("delete", "pod", name, "-n", sec.victim_ns, "--wait=false")


def a_forged_plain_bind_of_a_pod_without_gpu_request(sec: Sec) -> Outcome:
    """A pod of gpushare-scheduler without a GPU request (the extender places those too)
    whose node selector matches no node: filter never offered this node, so no bind."""
    name = f"nogpu-{uuid.uuid4().hex[:4]}"
    nowhere = {"schedulerName": SCHEDULER_NAME, "nodeSelector": {"gs-sec": "nowhere"}}
    doc = pod_doc(name, sec.cluster.busybox_image, spec=nowhere)
    sec.cluster.kubectl("apply", "-n", sec.attacker_ns, "-f", "-", input=json.dumps(doc))
    return forged_bind(sec, sec.attacker_ns, name, "was not offered")


def a_forged_bind_to_a_node_filter_never_offered(sec: Sec) -> Outcome:
    """A pending gpushare pod whose node selector matches no node: binding it anyway would
    place it against its own scheduling rules."""
    name = f"pinned-{uuid.uuid4().hex[:4]}"
    nowhere = {"nodeSelector": {"gs-sec": "nowhere"}}
    doc = pod_doc(name, sec.cluster.busybox_image, annotations={ANN_FRACTION: "0.05"}, spec=nowhere)
    refused, why = create(sec, doc)
    assert not refused, why
    return forged_bind(sec, sec.attacker_ns, name, "was not offered")


def forged_filter_calls_hold_capacity(sec: Sec) -> Outcome:
    """Issue: two fake filter calls held a 2-GPU node and a real 10 % pod was refused."""
    for i in range(40):
        fake = pod_doc(f"ghost-{i}", "x", annotations={ANN_FRACTION: "1"})
        fake["metadata"].update(namespace=sec.attacker_ns, uid=f"ghost-{i}")
        fake["spec"]["schedulerName"] = SCHEDULER_NAME
        fake["spec"]["containers"][0]["resources"] = {"limits": {RESOURCE_GPU_PERCENT: "100"}}
        post("filter", {"Pod": fake, "NodeNames": [sec.cluster.node_name]})
    name = f"real-{uuid.uuid4().hex[:4]}"
    refused, why = create(
        sec, pod_doc(name, sec.cluster.busybox_image, annotations={ANN_FRACTION: "0.1"})
    )
    assert not refused, why
    pod = running(sec, sec.attacker_ns, name)
    return bool(pod["spec"].get("nodeName")), "forged filter calls held nothing: a real pod ran"


def oversized_and_deep_bodies(sec: Sec) -> Outcome:
    codes = [
        post("filter", None, raw=b"[" * 200_000)[0],
        post("bind", None, raw=b'{"PodName":' + b"9" * 5000 + b"}")[0],
        post(
            "filter",
            None,
            raw=b'{"Pod":{"metadata":{"name":"x"}},"NodeNames":' + b"[" * 5000 + b"]}",
        )[0],
    ]
    with urllib.request.urlopen(f"http://127.0.0.1:{EXTENDER_PORT}/healthz", timeout=5) as r:
        alive = r.status == 200
    return all(c == 400 for c in codes) and alive, f"HTTP {codes}, extender alive: {alive}"


def patch_running_request_down(sec: Sec) -> Outcome:
    """Issue: a running 90 % pod patched to gpu-fraction 0.01 counted as 1 %."""
    name = tenant_running_pod(sec, "0.2")
    refused, why = tenant_annotates(sec, name, f"{ANN_FRACTION}=0.01")
    kept = sec.pod(sec.attacker_ns, name)["metadata"]["annotations"][ANN_FRACTION] == "0.2"
    return refused and kept and "fix:" in why, why


def patch_request_through_pod_status(sec: Sec) -> Outcome:
    name = tenant_running_pod(sec, "0.2")
    body = json.dumps({"metadata": {"annotations": {ANN_FRACTION: "0.01"}}})
    out = sec.kubectl(
        "patch",
        "pod",
        name,
        "-n",
        sec.attacker_ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        body,
        as_tenant=True,
    )
    return out.returncode != 0 and f"metadata.annotations[{ANN_FRACTION}]" in out.stderr, (
        out.stderr.strip()
    )


def patch_thread_share(sec: Sec) -> Outcome:
    """The thread share the device plugin gives the pod's next container (a batch pod may
    already run uncapped: then any other value is the change)."""
    name = tenant_running_pod(sec, "0.2")
    current = sec.pod(sec.attacker_ns, name)["metadata"]["annotations"][ANN_THREAD_PERCENT]
    wanted = "100" if current != "100" else "99"
    refused, why = tenant_annotates(sec, name, f"{ANN_THREAD_PERCENT}={wanted}")
    return refused, f"{current} -> {wanted}: {why}"


def patch_placement_onto_the_victims_gpu(sec: Sec) -> Outcome:
    name = tenant_running_pod(sec, "0.2")
    gpu = sec.victim["metadata"]["annotations"][ANN_GPU_UUID]
    return tenant_annotates(sec, name, f"{ANN_GPU_UUID}={gpu}")


def patch_state_back_to_assumed(sec: Sec) -> Outcome:
    """A pod marked assumed again could capture the next same-size pod's Allocate."""
    name = tenant_running_pod(sec, "0.2")
    return tenant_annotates(sec, name, f"{ANN_STATE}=assumed")


def patch_on_exclusive_policy(sec: Sec) -> Outcome:
    """Issue: any pod could set packing-policy exclusive and keep everyone off its GPU."""
    name = tenant_running_pod(sec, "0.2")
    return tenant_annotates(sec, name, f"{ANN_PACKING_POLICY}=exclusive")


def create_with_profiling_true(sec: Sec) -> Outcome:
    return create(
        sec,
        pod_doc(
            "profiler",
            sec.cluster.busybox_image,
            annotations={ANN_FRACTION: "0.1", ANN_PROFILING: "true"},
        ),
    )


def create_with_a_fake_profile(sec: Sec) -> Outcome:
    """A 5,000-digit number in gpushare.io/profile passed both webhooks (issue)."""
    profile = '{"gpuModel":"H100","memoryBytes":' + "9" * 5000 + "}"
    return create(
        sec,
        pod_doc(
            "profiled",
            sec.cluster.busybox_image,
            annotations={ANN_FRACTION: "0.1", ANN_PROFILE: profile},
        ),
    )


def create_exclusive_without_the_grant(sec: Sec) -> Outcome:
    name = f"solo-{uuid.uuid4().hex[:4]}"
    refused, why = create(
        sec,
        pod_doc(
            name,
            sec.cluster.busybox_image,
            annotations={ANN_FRACTION: "0.1", ANN_PACKING_POLICY: "exclusive"},
        ),
    )
    if refused:
        return True, why
    message = scheduling_message(sec, sec.attacker_ns, name)
    bound = sec.pod(sec.attacker_ns, name)["spec"].get("nodeName")
    return not bound and "neighbour-rules=granted" in message, message


def gpu_request_in_an_init_container(sec: Sec) -> Outcome:
    """Issue: a GPU request in an init container skipped the webhook and was never counted."""
    doc = pod_doc("init", sec.cluster.busybox_image)
    doc["spec"]["initContainers"] = [
        dict(
            doc["spec"]["containers"][0],
            name="setup",
            command=["true"],
            resources={"limits": {RESOURCE_GPU_PERCENT: "90"}},
        )
    ]
    return create(sec, doc)


def share_the_victims_gpu_from_another_namespace(sec: Sec) -> Outcome:
    """The victim's GPU has 70 % free; a 0.6 pod of another namespace is kept off it."""
    name = f"neighbour-{uuid.uuid4().hex[:4]}"
    refused, why = create(
        sec, pod_doc(name, sec.cluster.busybox_image, annotations={ANN_FRACTION: "0.6"})
    )
    assert not refused, why
    victim_gpu = sec.victim["metadata"]["annotations"][ANN_GPU_UUID]

    def settled() -> str | None:
        pod = sec.pod(sec.attacker_ns, name)
        placed = (pod["metadata"].get("annotations") or {}).get(ANN_GPU_UUID)
        if placed:
            return f"placed on {placed}"
        message = scheduling_message(sec, sec.attacker_ns, name, timeout_s=1)
        return message or None

    outcome = str(wait_until(settled, timeout_s=90) or "")
    kept_off = victim_gpu not in outcome and bool(outcome)
    return kept_off, f"kept off {victim_gpu}, the victim namespace's GPU: {outcome}"


def env_reexports_the_thread_cap(sec: Sec) -> Outcome:
    return create(
        sec,
        pod_doc(
            "envcap",
            sec.cluster.busybox_image,
            annotations={ANN_FRACTION: "0.1"},
            container={"env": [{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"}]},
        ),
    )


def mounts_the_mps_directories(sec: Sec) -> Outcome:
    doc = pod_doc(
        "mounter",
        sec.cluster.busybox_image,
        annotations={ANN_FRACTION: "0.1"},
        container={"volumeMounts": [{"name": "h", "mountPath": "/h"}]},
        spec={"volumes": [{"name": "h", "hostPath": {"path": "/run/gpushare"}}]},
    )
    return create(sec, doc)


def a_plain_pod_mounts_the_kubelet_plugin_and_cdi_directories(sec: Sec) -> Outcome:
    """Issue #45: a pod that is no gpushare pod (the webhook never sees it) mounted the MPS,
    kubelet-plugin and CDI host directories, and the protected list missed the last two. Now
    the chart's ValidatingAdmissionPolicy refuses each, also when written as a parent directory
    or with "//" and "/./": for gpushare's pods always, for every other pod under
    ``hostPathGuard.otherPods: deny`` (set here; the default only warns, issue #66,
    tests/cluster/test_host_path_neighbours.py)."""
    reasons = []
    for path in (
        "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/plugins/",
        "/var//run/./cdi",
        "/etc/cdi",
        "/var/lib",
        "/run/gpushare/node/mps",
    ):
        name = f"plain-mount-{uuid.uuid4().hex[:4]}"
        doc = pod_doc(
            name,
            sec.cluster.busybox_image,
            container={"volumeMounts": [{"name": "h", "mountPath": "/h"}]},
            spec={"volumes": [{"name": "h", "hostPath": {"path": path}}]},
        )
        refused, why = create(sec, doc)
        if not refused:
            sec.kubectl("delete", "pod", name, "-n", sec.attacker_ns, "--wait=false")
            return False, f"a plain pod mounting {path} was created"
        if "host directory gpushare protects" not in why:  # the other-pods policy
            return False, f"{path}: refused for another reason: {why}"
        reasons.append(why)
    return True, reasons[0]


def skips_the_scheduler_with_node_name(sec: Sec) -> Outcome:
    return create(
        sec,
        pod_doc(
            "direct",
            sec.cluster.busybox_image,
            annotations={ANN_FRACTION: "0.1"},
            spec={"nodeName": sec.cluster.node_name},
        ),
    )


def writes_its_own_placement_at_creation(sec: Sec) -> Outcome:
    gpu = sec.victim["metadata"]["annotations"][ANN_GPU_UUID]
    return create(
        sec,
        pod_doc(
            "squatter",
            sec.cluster.busybox_image,
            annotations={ANN_FRACTION: "0.1", ANN_GPU_UUID: gpu, ANN_THREAD_PERCENT: "100"},
        ),
    )


def forges_mps_fault_lines_from_its_container(sec: Sec) -> Outcome:
    """Issue: forged fault lines in the shared MPS log got a victim marked exclusive. The log
    directory is no longer in any container; unsetting the pipe variable still finds the
    daemon's pipe directory (MPS's default path is mounted too)."""
    name = f"forger-{uuid.uuid4().hex[:4]}"
    command = (
        "for d in /run/gpushare/node/mps/log /var/log/nvidia-mps; do "
        "(echo '[2026-01-01 00:00:00.000 Server 1] Client {PID: 1, Context: 1} encountered a "
        "fatal GPU error.' >> $d/server.log) 2>/dev/null && echo wrote-$d; done; "
        "ls /tmp/nvidia-mps >/dev/null 2>&1 && echo default-pipe-present; echo done; sleep 3600"
    )
    refused, why = create(
        sec,
        pod_doc(
            name, sec.cluster.busybox_image, annotations={ANN_FRACTION: "0.1"}, command=command
        ),
    )
    assert not refused, why
    running(sec, sec.attacker_ns, name)

    def logged() -> str:
        text = sec.cluster.kubectl("logs", name, "-n", sec.attacker_ns, check=False)
        return text if "done" in text else ""

    text = str(wait_until(logged, timeout_s=30))
    wrote = "wrote-" in text
    why = (
        "no MPS log directory in the container, nothing written; the daemon's pipe directory is "
        "also at MPS's default path (container said: " + text.strip().replace("\n", "; ") + ")"
    )
    return not wrote and "default-pipe-present" in text, why


def a_node_agent_token_for_another_nodes_pods(sec: Sec) -> Outcome:
    """The node agent's ServiceAccount, with a token bound to a pod on this node: it may patch
    pods of its node only (a pending pod, on no node, stands in for another node's), and
    write ResourceSlices (DRA mode) of its node only."""
    sa = f"{sec.release}-gpushare-node-agent"
    sec.cluster.kubectl("create", "serviceaccount", "-n", sec.agent_ns, sa, check=False)
    sec.cluster.kubectl(
        "create",
        "clusterrole",
        f"{sec.release}-agent",
        "--verb=get,patch,update,create,delete",
        "--resource=pods,nodes,resourceslices.resource.k8s.io",
    )
    sec.cluster.kubectl(
        "create",
        "clusterrolebinding",
        f"{sec.release}-agent",
        f"--clusterrole={sec.release}-agent",
        f"--serviceaccount={sec.agent_ns}:{sa}",
    )
    try:
        agent_pod = pod_doc("agent", sec.cluster.busybox_image, spec={"serviceAccountName": sa})
        sec.cluster.kubectl("apply", "-n", sec.agent_ns, "-f", "-", input=json.dumps(agent_pod))
        running(sec, sec.agent_ns, "agent")
        token = sec.cluster.kubectl(
            "create",
            "token",
            sa,
            "-n",
            sec.agent_ns,
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            "agent",
        ).strip()
        elsewhere = pod_doc(
            "elsewhere", sec.cluster.busybox_image, spec={"nodeSelector": {"gs-sec": "nowhere"}}
        )
        sec.cluster.kubectl("apply", "-n", sec.victim_ns, "-f", "-", input=json.dumps(elsewhere))
        base = [
            "kubectl",
            f"--token={token}",
            "--kubeconfig=/dev/null",
            f"--server={_server(sec)}",
            "--insecure-skip-tls-verify=true",
        ]

        def agent_patch(*args: str, input: str | None = None) -> Any:
            return subprocess.run(
                [*base, *args],
                input=input,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                env=sec.cluster.env,
            )

        foreign = agent_patch(
            "annotate", "pod", "elsewhere", "-n", sec.victim_ns, "x=1", "--overwrite"
        )
        own = agent_patch(
            "annotate", "pod", "victim", "-n", sec.victim_ns, "gs-sec/agent-ok=1", "--overwrite"
        )
        node = agent_patch(
            "annotate", "node", sec.cluster.node_name, "gs-sec/agent-ok=1", "--overwrite"
        )
        slice_for = {
            where: json.dumps(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": f"gs-sec-{where}"},
                    "spec": {
                        "driver": "gpu.gpushare.io",
                        "nodeName": node_name,
                        "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
                        "devices": [],
                    },
                }
            )
            for where, node_name in (("own", sec.cluster.node_name), ("other", "gs-sec-other"))
        }
        own_slice = agent_patch("create", "-f", "-", input=slice_for["own"])
        other_slice = agent_patch("create", "-f", "-", input=slice_for["other"])
        unbound = sec.cluster.kubectl("create", "token", sa, "-n", sec.agent_ns).strip()
        stolen = subprocess.run(
            [
                "kubectl",
                f"--token={unbound}",
                "--kubeconfig=/dev/null",
                f"--server={_server(sec)}",
                "--insecure-skip-tls-verify=true",
                "annotate",
                "node",
                sec.cluster.node_name,
                "gs-sec/agent-ok=2",
                "--overwrite",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=sec.cluster.env,
        )
        refused = foreign.returncode != 0 and stolen.returncode != 0 and other_slice.returncode != 0
        allowed = own.returncode == 0 and node.returncode == 0 and own_slice.returncode == 0
        why = (
            f"{foreign.stderr.strip()} | another node's slice: {other_slice.stderr.strip()} "
            f"| without a node claim: {stolen.stderr.strip()}"
        )
        if not allowed:
            why += (
                f" | own pod/node/slice refused too: {own.stderr.strip()} {node.stderr.strip()} "
                f"{own_slice.stderr.strip()}"
            )
        return refused and allowed, why
    finally:
        sec.cluster.kubectl(
            "annotate", "node", sec.cluster.node_name, "gs-sec/agent-ok-", check=False
        )
        sec.cluster.kubectl(
            "delete", "clusterrolebinding,clusterrole", f"{sec.release}-agent", check=False
        )
        sec.cluster.kubectl(
            "delete", "resourceslices", "gs-sec-own", "gs-sec-other", "--ignore-not-found",
            check=False,
        )  # fmt: skip


def _server(sec: Sec) -> str:
    config = yaml.safe_load(Path(sec.cluster.kubeconfig).read_text())
    return str(config["clusters"][0]["cluster"]["server"])


def extender_without_client_certificate(sec: Sec) -> Outcome:
    """A second real controller, serving its extender with certificates made as the controller
    makes them and client certificates required (the chart's default): a caller without
    gpushare-scheduler's certificate gets no answer, gpushare-scheduler's gets one."""
    import datetime as dt  # noqa: PLC0415
    import socket  # noqa: PLC0415
    import ssl  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from gpushare.cluster.issuing import Leaf, issue, make_ca  # noqa: PLC0415

    # The certificates the controller makes and keeps in its Secrets by default (the chart
    # renders none): a CA, the extender's serving certificate, gpushare-scheduler's client one.
    now = dt.datetime.now(dt.UTC)
    ca = make_ca(now=now)
    made = {
        "server": issue(
            ca, Leaf("extender-tls", "gpushare-extender", ("127.0.0.1",)), now=now, days=2
        ),
        "client": issue(ca, Leaf("extender-client", "gpushare-scheduler"), now=now, days=2),
    }
    work = Path(sec.controller.workdir) / "mtls"
    files: dict[str, Path] = {}
    for role, data in made.items():
        for key, value in data.items():
            path = work / role / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(value)
            files[f"{role}/{key}"] = path
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpushare.cluster",
            "--kubeconfig",
            str(sec.cluster.kubeconfig),
            "--extender-port",
            str(port),
            "--extender-tls-cert",
            str(files["server/tls.crt"]),
            "--extender-tls-key",
            str(files["server/tls.key"]),
            "--extender-client-ca",
            str(files["server/ca.crt"]),
            "--no-webhook",
            "--no-operator",
        ],
        env=sec.controller.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert wait_until(lambda: _port_open(port), timeout_s=60), "the controller never listened"
        body = json.dumps(
            {
                "PodName": "victim",
                "PodNamespace": sec.victim_ns,
                "PodUID": "",
                "Node": sec.cluster.node_name,
            }
        ).encode()
        anonymous = ssl.create_default_context(cafile=str(files["server/ca.crt"]))
        try:
            request = urllib.request.Request(f"https://127.0.0.1:{port}/scheduler/bind", data=body)
            urllib.request.urlopen(request, timeout=10, context=anonymous)
            refused, why = False, "answered a caller without a client certificate"
        except (urllib.error.URLError, ssl.SSLError, ConnectionError) as exc:
            refused, why = True, f"TLS refused the caller: {exc}"
        scheduler = ssl.create_default_context(cafile=str(files["server/ca.crt"]))
        scheduler.load_cert_chain(files["client/tls.crt"], files["client/tls.key"])
        url = f"https://127.0.0.1:{port}/healthz"
        with urllib.request.urlopen(url, timeout=10, context=scheduler) as answer:
            trusted = answer.status == 200
        return refused and trusted, why
    finally:
        proc.terminate()
        proc.wait(15)


def _port_open(port: int) -> bool:
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def a_pod_asking_for_an_exponent_near_a_million_cpus(sec: Sec) -> Outcome:
    """Issue #45: a plain pod (no gpushare annotation, any namespace) whose CPU request the API
    server stores as "1e999999" made the controller's host arithmetic raise; its pod list then
    failed as a whole forever, and a restarted controller never became ready. Now: a restarted
    controller lists it, becomes ready, and the tenant's next GPU pod runs."""
    name = f"huge-{uuid.uuid4().hex[:4]}"
    resources = {"requests": {"cpu": "1e999999", "memory": "1e999999"}}
    doc = pod_doc(
        name,
        sec.cluster.busybox_image,
        spec={"nodeSelector": {"gs-sec": "nowhere"}},
        container={"resources": resources},
    )
    refused, why = create(sec, doc)
    if refused:
        return True, f"the API server refused the quantity: {why}"
    try:
        stored = sec.pod(sec.attacker_ns, name)["spec"]["containers"][0]["resources"]
        sec.controller.stop()
        sec.controller.start(timeout=120)  # its first list holds the pod
        # The next GPU pod goes beside the victim: the attacker's own GPU is full of the
        # pods earlier attacks left running, and tenancy keeps it off the victim's GPU.
        after = f"after-{uuid.uuid4().hex[:4]}"
        doc = pod_doc(after, sec.cluster.busybox_image, annotations={ANN_FRACTION: "0.05"})
        sec.cluster.kubectl("apply", "-n", sec.victim_ns, "-f", "-", input=json.dumps(doc))
        placed = running(sec, sec.victim_ns, after)
        sec.cluster.kubectl("delete", "pod", after, "-n", sec.victim_ns, "--wait=false")
        return bool(placed["spec"].get("nodeName")), (
            f"stored {stored['requests']}; the restarted controller listed it, became ready "
            "and placed the next GPU pod"
        )
    finally:
        sec.kubectl("delete", "pod", name, "-n", sec.attacker_ns, "--wait=false")


def _get(url: str, token: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=15) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def reads_metrics_and_profiles_with_a_tenant_token(sec: Sec) -> Outcome:
    """Issue #45: the controller's /metrics named every namespace's GpuShares and profiles, a
    node agent's /metrics and /profile every pod on its node, to anyone. Now the tenant's own
    ServiceAccount token, or none, gets 401/403 with the fix, and the victim's name nowhere;
    a scraper allowed to get /metrics (as Prometheus is) still reads them."""
    token = sec.kubectl("create", "token", "tenant", "-n", sec.attacker_ns).stdout.strip()
    assert token, "no tenant token"
    agent = f"http://127.0.0.1:{sec.agent.metrics_port}"
    gpu = sec.victim["metadata"]["annotations"].get(ANN_GPU_UUID, "0")
    tries = {
        "agent /metrics, tenant token": _get(f"{agent}/metrics", token),
        "agent /metrics, no token": _get(f"{agent}/metrics", None),
        "agent /profile, tenant token": _get(f"{agent}/profile?gpu={gpu}", token),
        "controller /metrics, tenant token": _get(f"{EXTENDER.rsplit('/', 1)[0]}/metrics", token),
        "controller /metrics, no token": _get(f"{EXTENDER.rsplit('/', 1)[0]}/metrics", None),
    }
    scraper, _ = _get(f"{agent}/metrics", scraper_token(sec.cluster))
    refused = all(status in (401, 403) and "victim" not in body for status, body in tries.values())
    why = "; ".join(f"{k}: {status} {body.strip()[:140]}" for k, (status, body) in tries.items())
    return refused and scraper == 200, f"{why}; a scraper allowed /metrics: {scraper}"


def holds_the_agents_port_with_idle_connections(sec: Sec) -> Outcome:
    """Issue #45: the node agent's HTTP server held a thread per idle connection, without a
    timeout, so a tenant pod on the host network could starve the kubelet's probes and the
    operator's profile reads. Now: 300 idle connections; beyond the bound they are closed at
    once, the rest within the idle timeout, and the server answers again."""
    import socket  # noqa: PLC0415

    port = sec.agent.metrics_port
    held = []
    try:
        for _ in range(300):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        deadline = time.monotonic() + 30
        answered = 0
        while time.monotonic() < deadline and not answered:
            try:
                answered, _ = _get(f"http://127.0.0.1:{port}/healthz", None)
            except OSError:
                time.sleep(0.5)
        waited = 30 - (deadline - time.monotonic())
        # Within the idle timeout (10 s) the agent closes every one it had accepted.
        closing = time.monotonic() + 15
        still_open = 0
        for s in held:
            s.settimeout(max(0.1, closing - time.monotonic()))
            try:
                still_open += s.recv(1) != b""
            except TimeoutError:
                still_open += 1
            except OSError:
                pass
    finally:
        for s in held:
            s.close()
    return answered == 200 and still_open == 0, (
        f"/healthz answered {answered} after {waited:.1f}s with 300 connections opened; "
        f"{still_open} of them still held by the agent 15 s later"
    )


# ---- round three: opportunistic placement, tiers, quantities, labels, namespaces ---------


def all_refused(sec: Sec, docs: dict[str, dict[str, Any]], expect: str = "") -> Outcome:
    """Create each document as the tenant; refused when every one is, each with ``expect`` in
    its reason (any reason when empty). A document created by mistake is deleted again."""
    reasons = []
    for label, doc in docs.items():
        refused, why = create(sec, doc)
        if not refused:
            name = doc["metadata"]["name"]
            sec.kubectl("delete", "pod", name, "-n", sec.attacker_ns, "--wait=false")
            return False, f"{label}: created"
        if expect not in why:
            return False, f"{label}: refused for another reason: {why}"
        reasons.append(f"{label}: {why.rsplit('denied the request: ', 1)[-1][:160]}")
    return True, " | ".join(reasons)


def opts_a_latency_pod_into_opportunistic_placement(sec: Sec) -> Outcome:
    """Latency pods are protected and never preempted; one opted in would run beyond a GPU's
    guaranteed capacity beside pods that count on it."""
    doc = pod_doc(
        "latopp",
        sec.cluster.busybox_image,
        annotations={ANN_FRACTION: "0.1", ANN_CLASS: "latency", ANN_OPPORTUNISTIC: "true"},
    )
    return all_refused(sec, {"annotation": doc}, expect=ANN_OPPORTUNISTIC)


def asks_for_opportunistic_slices_without_the_opt_in(sec: Sec) -> Outcome:
    """gpushare.io/opportunistic-gpu-percent asked for directly, past the webhook's say: as a
    latency pod (also with the opt-in written "false"), beside gpu-percent, and for two GPUs.
    The webhook reads the resource as the opt-in and refuses what it cannot honour."""

    def direct(name: str, limits: dict[str, str], ann: dict[str, str]) -> dict[str, Any]:
        return pod_doc(
            name,
            sec.cluster.busybox_image,
            annotations=ann,
            container={"resources": {"limits": limits}},
        )

    opp = {RESOURCE_GPU_OPPORTUNISTIC: "10"}
    return all_refused(
        sec,
        {
            "latency": direct("oppdirect1", opp, {ANN_CLASS: "latency"}),
            "latency, opt-in false": direct(
                "oppdirect2", opp, {ANN_CLASS: "latency", ANN_OPPORTUNISTIC: "false"}
            ),
            "both resources": direct("oppdirect3", {**opp, RESOURCE_GPU_PERCENT: "10"}, {}),
            "two GPUs": direct("oppdirect4", {RESOURCE_GPU_OPPORTUNISTIC: "200"}, {}),
            "beside a fraction": direct("oppdirect5", opp, {ANN_FRACTION: "0.1"}),
        },
        expect="gpushare",
    )


def opts_a_two_gpu_pod_into_opportunistic_placement(sec: Sec) -> Outcome:
    """Opportunistic placement predicts and preempts per GPU; a pod of several whole GPUs
    opted in would hold GPUs beyond their guaranteed capacity."""
    doc = pod_doc(
        "bigopp",
        sec.cluster.busybox_image,
        annotations={ANN_FRACTION: "2", ANN_OPPORTUNISTIC: "true"},
    )
    return all_refused(sec, {"fraction 2": doc}, expect=ANN_OPPORTUNISTIC)


def forges_its_tier_at_creation(sec: Sec) -> Outcome:
    """Found in this round: gpushare.io/tier was not among the placement annotations the
    webhook refuses at creation, and a Binding's annotations merge into the pod's, so a pod
    created with tier opportunistic and placed guaranteed kept the forged tier: its share
    left the GPU's guaranteed capacity. Also the guaranteed share it was accounted for."""
    return all_refused(
        sec,
        {
            "tier opportunistic": pod_doc(
                "tierforge1",
                sec.cluster.busybox_image,
                annotations={ANN_FRACTION: "0.1", ANN_TIER: "opportunistic"},
            ),
            "tier guaranteed, opted in": pod_doc(
                "tierforge2",
                sec.cluster.busybox_image,
                annotations={
                    ANN_FRACTION: "0.1",
                    ANN_OPPORTUNISTIC: "true",
                    ANN_TIER: "guaranteed",
                },
            ),
            "request-percentage 1": pod_doc(
                "tierforge3",
                sec.cluster.busybox_image,
                annotations={ANN_FRACTION: "0.5", ANN_REQUEST_PERCENT: "1"},
            ),
        },
        expect="is written by gpushare when it places the pod",
    )


def patches_its_tier_to_hide_its_share(sec: Sec) -> Outcome:
    """A placed pod marked opportunistic holds no guaranteed share in the controller's count;
    marked guaranteed, an opportunistic one would escape preemption."""
    name = tenant_running_pod(sec, "0.2")
    refused, why = tenant_annotates(sec, name, f"{ANN_TIER}=opportunistic")
    kept = ANN_TIER not in sec.pod(sec.attacker_ns, name)["metadata"]["annotations"]
    return refused and kept, why


def patches_its_opt_in_after_admission(sec: Sec) -> Outcome:
    """The opt-in decided the resource and the placement; flipping it afterwards (in, to
    look preemptible to nobody; out, to escape preemption) changes nothing the pod holds."""
    name = tenant_running_pod(sec, "0.2")
    refused, why = tenant_annotates(sec, name, f"{ANN_OPPORTUNISTIC}=true")
    return refused and "fix:" in why, why


def huge_quantities_in_each_gpu_resource_field(sec: Sec) -> Outcome:
    """The GPU resources of a container as the API server stores them, each hostile: an
    exponent near a million, beyond int64, beyond the most GPUs a pod may ask, and in
    requests only. The controller stays ready afterwards."""

    def res(name: str, resources: dict[str, Any], ann: dict[str, str] | None = None) -> Any:
        return pod_doc(
            name,
            sec.cluster.busybox_image,
            annotations=ann or {},
            container={"resources": resources},
        )

    outcome = all_refused(
        sec,
        {
            "gpu-percent 1e999999": res("q1", {"limits": {RESOURCE_GPU_PERCENT: "1e999999"}}),
            "opportunistic 9E18": res("q2", {"limits": {RESOURCE_GPU_OPPORTUNISTIC: "9E18"}}),
            "gpu-percent 102500": res("q3", {"limits": {RESOURCE_GPU_PERCENT: "102500"}}),
            "requests 1e999999 beside a fraction": res(
                "q4",
                {"requests": {RESOURCE_GPU_PERCENT: "1e999999"}},
                {ANN_FRACTION: "0.1"},
            ),
        },
    )
    with urllib.request.urlopen(f"http://127.0.0.1:{EXTENDER_PORT}/healthz", timeout=5) as r:
        alive = r.status == 200
    return outcome[0] and alive, f"{outcome[1]}; controller healthy: {alive}"


def huge_host_quantities_in_a_gpu_pod(sec: Sec) -> Outcome:
    """A GPU pod whose CPU request, memory and ephemeral-storage limits carry exponents near
    a million (stored by the API server): it is not placed, and the controller places the
    next GPU pod (beside the victim: the attacker's GPU is full)."""
    name = f"hugegpu-{uuid.uuid4().hex[:4]}"
    resources = {
        "requests": {"cpu": "1e999999"},
        "limits": {"memory": "1e999999", "ephemeral-storage": "9E999999"},
    }
    doc = pod_doc(
        name,
        sec.cluster.busybox_image,
        annotations={ANN_FRACTION: "0.05"},
        container={"resources": resources},
    )
    refused, why = create(sec, doc)
    if refused:
        return True, f"refused at creation: {why}"
    try:
        after = f"after-{uuid.uuid4().hex[:4]}"
        nxt = pod_doc(after, sec.cluster.busybox_image, annotations={ANN_FRACTION: "0.05"})
        sec.cluster.kubectl("apply", "-n", sec.victim_ns, "-f", "-", input=json.dumps(nxt))
        placed = running(sec, sec.victim_ns, after)
        sec.cluster.kubectl("delete", "pod", after, "-n", sec.victim_ns, "--wait=false")
        hostile = sec.pod(sec.attacker_ns, name)
        unplaced = not hostile["spec"].get("nodeName")
        message = scheduling_message(sec, sec.attacker_ns, name, timeout_s=30)
        return unplaced and bool(placed["spec"].get("nodeName")), (
            f"not placed ({message[:200]}); the next GPU pod ran"
        )
    finally:
        sec.kubectl("delete", "pod", name, "-n", sec.attacker_ns, "--wait=false")


def names_another_namespaces_gpushare(sec: Sec) -> Outcome:
    """A pod takes its GpuShare's fraction, class and rules; one in another namespace (the
    victim's) is not the tenant's to take."""
    doc = pod_doc(
        "crossshare",
        sec.cluster.busybox_image,
        annotations={ANN_SHARE: f"{sec.victim_ns}/victim-share"},
    )
    return all_refused(sec, {"namespace/name": doc}, expect=ANN_SHARE)


def forges_namespace_grant_labels_on_the_pod(sec: Sec) -> Outcome:
    """Sharing groups and the neighbour-rules grant are namespace labels only an admin sets;
    written on the pod they grant nothing: the exclusive policy stays refused."""
    name = f"labelled-{uuid.uuid4().hex[:4]}"
    doc = pod_doc(
        name,
        sec.cluster.busybox_image,
        annotations={ANN_FRACTION: "0.1", "gpushare.io/packing-policy": "exclusive"},
    )
    doc["metadata"]["labels"] = {
        LABEL_NEIGHBOUR_RULES: "granted",
        LABEL_SHARING_GROUP: sec.victim_ns,
    }
    refused, why = create(sec, doc)
    if refused:
        return True, why
    try:
        message = scheduling_message(sec, sec.attacker_ns, name)
        bound = sec.pod(sec.attacker_ns, name)["spec"].get("nodeName")
        return not bound and "neighbour-rules=granted" in message, message
    finally:
        sec.kubectl("delete", "pod", name, "-n", sec.attacker_ns, "--wait=false")


def creates_a_pod_in_the_release_namespace(sec: Sec) -> Outcome:
    """The release namespace is exempt from the host-path policy (the node agent mounts the
    MPS directories); a tenant creating a pod there would mount them too."""
    doc = pod_doc(
        "inrelease",
        sec.cluster.busybox_image,
        container={"volumeMounts": [{"name": "h", "mountPath": "/h"}]},
        spec={"volumes": [{"name": "h", "hostPath": {"path": "/run/gpushare"}}]},
    )
    out = sec.kubectl(
        "create", "-n", sec.agent_ns, "-f", "-", as_tenant=True, stdin=json.dumps(doc)
    )
    if out.returncode == 0:
        sec.kubectl("delete", "pod", "inrelease", "-n", sec.agent_ns, "--wait=false")
    return out.returncode != 0 and "forbidden" in out.stderr.lower(), out.stderr.strip()


def gives_a_second_container_a_gpu_share(sec: Sec) -> Outcome:
    """MPS limits apply per client: a sidecar with its own share would be a second client on
    one placement, counted once."""
    doc = pod_doc(
        "twoshares",
        sec.cluster.busybox_image,
        annotations={ANN_FRACTION: "0.1"},
        container={"resources": {"limits": {RESOURCE_GPU_PERCENT: "10"}}},
    )
    side = dict(doc["spec"]["containers"][0], name="side")
    doc["spec"]["containers"].append(side)
    return all_refused(sec, {"sidecar": doc}, expect="gpushare")


def points_the_gpu_container_at_one_that_is_not_there(sec: Sec) -> Outcome:
    """gpushare.io/container naming an init container or no container: the share would go
    to a container the placement never accounted for."""
    doc = pod_doc(
        "wrongc",
        sec.cluster.busybox_image,
        annotations={ANN_FRACTION: "0.1", ANN_CONTAINER: "setup"},
    )
    doc["spec"]["initContainers"] = [
        dict(doc["spec"]["containers"][0], name="setup", command=["true"])
    ]
    missing = pod_doc(
        "nocontainer",
        sec.cluster.busybox_image,
        annotations={ANN_FRACTION: "0.1", ANN_CONTAINER: "ghost"},
    )
    return all_refused(sec, {"init": doc, "missing": missing}, expect=ANN_CONTAINER)


def loads_mps_variables_through_env_from(sec: Sec) -> Outcome:
    """envFrom a ConfigMap the tenant owns could set CUDA_MPS_ACTIVE_THREAD_PERCENTAGE or
    CUDA_VISIBLE_DEVICES after the webhook looked (it cannot read the ConfigMap): refused
    unless a prefix keeps every key off the reserved names."""

    def env_from(name: str, prefix: str | None) -> dict[str, Any]:
        source: dict[str, Any] = {"configMapRef": {"name": "gpu-env", "optional": True}}
        if prefix is not None:
            source["prefix"] = prefix
        return pod_doc(
            name,
            sec.cluster.busybox_image,
            annotations={ANN_FRACTION: "0.1"},
            container={"envFrom": [source]},
        )

    return all_refused(
        sec,
        {"no prefix": env_from("envfrom1", None), "prefix CUDA_": env_from("envfrom2", "CUDA_")},
        expect="envFrom",
    )


def asks_for_whole_nvidia_gpus_beside_its_share(sec: Sec) -> Outcome:
    """nvidia.com/gpu beside a gpushare share: a whole GPU from NVIDIA's plugin that no
    gpushare placement counts, shared with the pods placed on it."""
    doc = pod_doc(
        "doubledip",
        sec.cluster.busybox_image,
        annotations={ANN_FRACTION: "0.1"},
        container={"resources": {"limits": {NVIDIA_GPU_RESOURCE: "1"}}},
    )
    return all_refused(sec, {"nvidia.com/gpu 1": doc}, expect=NVIDIA_GPU_RESOURCE)


def odd_spellings_of_its_request(sec: Sec) -> Outcome:
    """Fractions and GPU memory the parser might read as more, less or nothing: below a
    percent, NaN, an exponent, a non-ASCII digit, a negative, and a memory exponent."""
    spellings = {
        "0.0001": {ANN_FRACTION: "0.0001"},
        "NaN": {ANN_FRACTION: "NaN"},
        "1e999": {ANN_FRACTION: "1e999"},
        "arabic three": {ANN_FRACTION: "\u0663"},
        "-0.5": {ANN_FRACTION: "-0.5"},
        "memory 1e999999Gi": {ANN_FRACTION: "0.1", ANN_MEMORY: "1e999999Gi"},
    }
    docs = {
        label: pod_doc(f"odd{i}", sec.cluster.busybox_image, annotations=ann)
        for i, (label, ann) in enumerate(spellings.items())
    }
    return all_refused(sec, docs, expect="gpushare.io/gpu-")


def routes_around_gpushare_scheduler_with_the_default_scheduler(sec: Sec) -> Outcome:
    """A pod asking gpu-percent directly of default-scheduler: the kubelet would hand it
    slices no placement counts. The webhook makes gpushare-scheduler place it (pinned to no
    node here, so it stays pending and holds nothing)."""
    name = f"defsched-{uuid.uuid4().hex[:4]}"
    doc = pod_doc(
        name,
        sec.cluster.busybox_image,
        spec={"schedulerName": "default-scheduler", "nodeSelector": {"gs-sec": "nowhere"}},
        container={"resources": {"limits": {RESOURCE_GPU_PERCENT: "10"}}},
    )
    refused, why = create(sec, doc)
    if refused:
        return True, why
    try:
        scheduler = sec.pod(sec.attacker_ns, name)["spec"].get("schedulerName")
        return scheduler == SCHEDULER_NAME, f"created with schedulerName {scheduler!r}"
    finally:
        sec.kubectl("delete", "pod", name, "-n", sec.attacker_ns, "--wait=false")


WATCH_FREED_S = 20.0
"""How long a pod patched to Succeeded is watched for its share being freed: a share freed at
the patch (the fault found) lets the probe be bound in its first scheduling cycles."""


def declares_its_running_pod_finished(sec: Sec) -> Outcome:
    """A share stops counting once its pod has finished, and a tenant may write pods/status:
    a running pod patched to phase Succeeded. The API server then refuses the kubelet's own
    status updates (a terminal phase never goes back), and on this cluster the kubelet kept
    the container running (150 s observed); found in this round, the controller freed the
    share at once. Now the share counts while a container runs: a second pod of the same
    size, created right after, is not bound to that GPU while the patched pod's heartbeat
    goes on. Last in the list: it replaces the tenant's running pod (its GPU is full)."""
    sec.kubectl("delete", "pod", "own-02", "-n", sec.attacker_ns, "--wait=true")
    beat, probe = f"beat-{uuid.uuid4().hex[:4]}", f"probe-{uuid.uuid4().hex[:4]}"
    heartbeat = "while true; do date +%s; sleep 1; done"
    doc = pod_doc(
        beat, sec.cluster.busybox_image, annotations={ANN_FRACTION: "0.2"}, command=heartbeat
    )
    refused, why = create(sec, doc)
    assert not refused, why
    gpu = running(sec, sec.attacker_ns, beat)["metadata"]["annotations"][ANN_GPU_UUID]
    out = sec.kubectl(
        "patch",
        "pod",
        beat,
        "-n",
        sec.attacker_ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Succeeded"}}),
        as_tenant=True,
    )
    if out.returncode != 0:
        return True, out.stderr.strip()
    patched = time.monotonic()
    refused, why = create(
        sec, pod_doc(probe, sec.cluster.busybox_image, annotations={ANN_FRACTION: "0.2"})
    )
    assert not refused, why

    def beats() -> list[int]:
        logs = sec.kubectl("logs", beat, "-n", sec.attacker_ns).stdout.split()
        return [int(line) for line in logs if line.isdigit()]

    bound_at: float | None = None
    probe_gpu = None
    try:
        while time.monotonic() - patched < WATCH_FREED_S and bound_at is None:
            ann = sec.pod(sec.attacker_ns, probe)["metadata"].get("annotations") or {}
            if ANN_BIND_TIME in ann:
                stamp = ann[ANN_BIND_TIME].replace("Z", "+00:00")
                bound_at = datetime.fromisoformat(stamp).timestamp()
                probe_gpu = ann.get(ANN_GPU_UUID)
            time.sleep(1)
        time.sleep(3)  # a heartbeat or two after the last look
        seen = beats()
    finally:
        sec.kubectl("delete", "pod", probe, beat, "-n", sec.attacker_ns, "--wait=false")
    ran = round(seen[-1] - seen[0], 0) if seen else 0
    if bound_at is not None and probe_gpu == gpu and any(b >= bound_at + 1 for b in seen):
        return False, (
            "a pod of the same size was bound to its GPU while the patched pod still ran: the "
            "share had been freed"
        )
    outcome = (
        f"bound to another GPU ({probe_gpu})"
        if bound_at is not None and probe_gpu != gpu
        else "bound only after the patched pod stopped"
        if bound_at is not None
        else f"not bound for {WATCH_FREED_S:.0f} s"
    )
    return True, (
        f"phase patched to Succeeded; the container kept running (heartbeats over {ran:.0f} s) "
        f"and its share kept counting: the next pod of its size was {outcome}"
    )


# ---- round four: the node agents' Leases ----------------------------------------------------
#
# Each node agent renews the Lease gpushare-agent-<node> of the release namespace; the controller
# refuses a node whose agent's Lease went unrenewed (gpushare.cluster.state.agents). The test
# controller and node agent run as host processes, with the Leases in "default" (the
# controller's --agent-lease-namespace there); this module's release namespace holds the agent's
# ServiceAccount and the chart's node-agent RBAC, and its Lease Role is also bound in "default",
# so the agent's token writes the very Lease the controller reads.

LEASE_NS = "default"
"""Where the test controller reads the agents' Leases and the test node agent renews its own."""
OTHER_NODE = "gs-sec-other"
"""Another node's name: its Lease is written as its own agent would."""


def _agent_sa(sec: Sec) -> str:
    return f"{sec.release}-gpushare-node-agent"


def _lease_doc(name: str, holder: str, renew: str, duration: Any = 6) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration, "renewTime": renew},
    }


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def as_token(sec: Sec, token: str, *args: str, stdin: str | None = None) -> Any:
    """kubectl as the holder of ``token`` (no kubeconfig credentials)."""
    return subprocess.run(
        [
            "kubectl",
            f"--token={token}",
            "--kubeconfig=/dev/null",
            f"--server={_server(sec)}",
            "--insecure-skip-tls-verify=true",
            *args,
        ],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=sec.cluster.env,
    )


def lease_path(namespace: str, name: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"


def patch_as_token(sec: Sec, token: str, path: str, body: Any) -> Any:
    """A merge PATCH straight to the API server as the holder of ``token``, as the node agent
    renews its Lease (``kubectl patch`` would GET first, a right the agent's Role lacks).
    Answers like kubectl: returncode 0 when written, else stderr "Error from server (Reason):
    message"."""
    import ssl  # noqa: PLC0415

    request = urllib.request.Request(
        f"{_server(sec)}{path}",
        data=json.dumps(body).encode(),
        method="PATCH",
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/merge-patch+json",
        },
    )
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as resp:
            out = resp.read().decode(errors="replace")
        return subprocess.CompletedProcess(["PATCH", path], 0, out, "")
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        try:
            status = json.loads(text)
            text = f"Error from server ({status.get('reason', exc.code)}): {status['message']}"
        except (ValueError, KeyError, AttributeError):
            text = f"Error from server ({exc.code}): {text}"
        return subprocess.CompletedProcess(["PATCH", path], 1, "", text)


def tenant_token(sec: Sec) -> str:
    """A token of the tenant's ServiceAccount, as a pod of its namespace would hold."""
    return str(sec.cluster.kubectl("create", "token", "tenant", "-n", sec.attacker_ns)).strip()


def may(sec: Sec, user: str, verb: str, resource: str, namespace: str) -> None:
    """Wait until RBAC lets ``user`` do it (a new binding takes a moment to count)."""

    def allowed() -> bool:
        out = sec.cluster.kubectl(
            "auth", "can-i", verb, resource, "-n", namespace, f"--as={user}", check=False
        )
        return bool(out.strip() == "yes")

    assert wait_until(allowed, timeout_s=30), f"RBAC never let {user} {verb} {resource}"


@contextlib.contextmanager
def chart_agent_rbac(sec: Sec) -> Iterator[str]:
    """The chart's node-agent RBAC (templates/node-rbac.yaml) for this module's release, its
    Lease Role also bound in LEASE_NS; yields the agent ServiceAccount's name."""
    helm = helm_binary()
    assert helm is not None
    rendered = subprocess.run(
        [
            helm,
            "template",
            sec.release,
            str(CHART),
            "--namespace",
            sec.agent_ns,
            "--kube-version",
            KUBE_VERSION,
            "--show-only",
            "templates/node-rbac.yaml",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    here = [
        {**d, "metadata": {**d["metadata"], "namespace": LEASE_NS}}
        for d in docs
        if d["kind"] in ("Role", "RoleBinding")
    ]
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": [*docs, *here]})
    sec.cluster.kubectl("apply", "-f", "-", input=manifest)
    user = f"system:serviceaccount:{sec.agent_ns}:{_agent_sa(sec)}"
    for namespace in (sec.agent_ns, LEASE_NS):
        may(sec, user, "patch", "leases.coordination.k8s.io", namespace)
    try:
        yield _agent_sa(sec)
    finally:
        cluster_wide = [*here, *(d for d in docs if d["kind"].startswith("Cluster"))]
        sec.cluster.kubectl(
            "delete",
            "-f",
            "-",
            "--ignore-not-found",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": cluster_wide}),
            check=False,
        )


def agent_pod_token(sec: Sec, pod: str) -> str:
    """A token of the agent's ServiceAccount bound to a running pod ``pod`` of the release
    namespace on this node, as the kubelet mounts into the agent: it carries the node claim."""
    doc = pod_doc(pod, sec.cluster.busybox_image, spec={"serviceAccountName": _agent_sa(sec)})
    # A ServiceAccount just made may not be known to pod admission for a moment.
    applied = wait_until(
        lambda: sec.cluster.kubectl(
            "apply", "-n", sec.agent_ns, "-f", "-", input=json.dumps(doc), check=False
        ).strip(),
        timeout_s=30,
    )
    assert applied, f"the agent pod {sec.agent_ns}/{pod} was never created"
    running(sec, sec.agent_ns, pod)
    return str(sec.cluster.kubectl(
        "create", "token", _agent_sa(sec), "-n", sec.agent_ns,
        "--bound-object-kind", "Pod", "--bound-object-name", pod,
    )).strip()  # fmt: skip


def node_verdict(sec: Sec) -> tuple[bool, str]:
    """(offered, why not) of the extender's filter for this node, asked for a pod that exists
    nowhere (a filter holds nothing for it), of the victim's namespace (its GPU has room)."""
    probe = pod_doc(f"probe-{uuid.uuid4().hex[:6]}", sec.cluster.busybox_image)
    probe["metadata"].update(namespace=sec.victim_ns, uid=str(uuid.uuid4()))
    probe["metadata"]["annotations"] = {ANN_FRACTION: "0.05"}
    probe["spec"]["schedulerName"] = SCHEDULER_NAME
    probe["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "1m", "memory": "4Mi"},
        "limits": {RESOURCE_GPU_PERCENT: "5"},
    }
    node = sec.cluster.node_name
    _, answer = post("filter", {"Pod": probe, "NodeNames": [node]})
    if not isinstance(answer, dict):
        return False, str(answer)
    refused = {
        **(answer.get("FailedNodes") or {}),
        **(answer.get("FailedAndUnresolvableNodes") or {}),
    }
    return node in (answer.get("NodeNames") or []), str(refused.get(node, answer.get("Error", "")))


AGENT_GONE = "is gone"
"""In the controller's refusal of a node whose agent's Lease expired."""


@contextlib.contextmanager
def agent_killed(sec: Sec) -> Iterator[float]:
    """SIGKILL the node agent (it writes nothing more); a new one is started afterwards and
    the node offered again before the next attack. Yields the kill's monotonic time."""
    found = find_agent(sec.cluster.node_name)
    assert found is not None, "no node agent runs"
    sigkill(found[0])
    try:
        yield time.monotonic()
    finally:
        sec.agent.start()
        assert wait_until(lambda: node_verdict(sec)[0], timeout_s=60), (
            f"the node was not offered again once a new agent ran: {node_verdict(sec)[1]}"
        )


def placed_in_victim_namespace(sec: Sec) -> str:
    """A new 5 % pod beside the victim runs (the node is placeable); deleted again."""
    name = f"after-{uuid.uuid4().hex[:4]}"
    doc = pod_doc(name, sec.cluster.busybox_image, annotations={ANN_FRACTION: "0.05"})
    sec.cluster.kubectl("apply", "-n", sec.victim_ns, "-f", "-", input=json.dumps(doc))
    try:
        pod = running(sec, sec.victim_ns, name)
        return str(pod["spec"].get("nodeName") or "")
    finally:
        sec.cluster.kubectl("delete", "pod", name, "-n", sec.victim_ns, "--wait=false")


def another_nodes_agent_writes_renews_or_deletes_a_lease(sec: Sec) -> Outcome:
    """The agent of this node (a token bound to its pod, with the chart's RBAC) against the
    Lease of another node's agent, in the release namespace: create, renew (patch), replace,
    delete; also the controller's leader-election Lease. The chart's Role lets an agent create
    and patch Leases there (RBAC cannot name each node's), so the node-agent guard policy must
    refuse every other node's; replace and delete are not in the Role at all, and with a Role
    widened to them (an admin's mistake) the guard still refuses. The agent's own Lease is
    written as before, and the other node's is unchanged."""
    node = sec.cluster.node_name
    own, other = agent_lease_name(node), agent_lease_name(OTHER_NODE)
    assert own is not None and other is not None
    ns = sec.agent_ns
    sec.cluster.kubectl(
        "apply", "-n", ns, "-f", "-",
        input=json.dumps(_lease_doc(other, f"gpushare-node-agent/{OTHER_NODE}", _now())),
    )  # fmt: skip
    with chart_agent_rbac(sec) as sa:
        token = agent_pod_token(sec, "agent-lease")
        before = kubectl_json(sec.cluster, "get", "lease", other, "-n", ns)
        renew = {"spec": {"renewTime": _now(), "leaseDurationSeconds": 3600}}
        replaced = _lease_doc(other, f"gpushare-node-agent/{node}", _now(), 3600)
        # Leases take no unconditional update: the PUT names the version it replaces.
        replaced["metadata"].update(
            namespace=ns, resourceVersion=before["metadata"]["resourceVersion"]
        )
        hostile = {
            "create another node's Lease": as_token(
                sec, token, "create", "-n", ns, "-f", "-",
                stdin=json.dumps(_lease_doc(f"{other}-2", "x", _now())),
            ),
            "renew another node's Lease": patch_as_token(
                sec, token, lease_path(ns, other), renew
            ),
            "replace another node's Lease": as_token(
                sec, token, "replace", "-f", "-", stdin=json.dumps(replaced)
            ),
            "delete another node's Lease": as_token(sec, token, "delete", "lease", other, "-n", ns),
            "create the controller's leader Lease": as_token(
                sec, token, "create", "-n", ns, "-f", "-",
                stdin=json.dumps(_lease_doc("gpushare-controller", "x", _now())),
            ),
        }  # fmt: skip
        own_writes = {
            "create its own Lease": as_token(
                sec, token, "create", "-n", ns, "-f", "-",
                stdin=json.dumps(_lease_doc(own, f"gpushare-node-agent/{node}", _now())),
            ),
            "renew its own Lease": patch_as_token(sec, token, lease_path(ns, own), renew),
        }  # fmt: skip
        widened = f"{sec.release}-widened-leases"
        sec.cluster.kubectl(
            "create", "role", widened, "-n", ns, "--verb=update,delete", "--resource=leases"
        )
        sec.cluster.kubectl(
            "create", "rolebinding", widened, "-n", ns, f"--role={widened}",
            f"--serviceaccount={ns}:{sa}",
        )  # fmt: skip
        try:
            guard_only: dict[str, Callable[[], Any]] = {
                "replace, Role widened": lambda: as_token(
                    sec, token, "replace", "-f", "-", stdin=json.dumps(replaced)
                ),
                "delete, Role widened": lambda: as_token(
                    sec, token, "delete", "lease", other, "-n", ns
                ),
            }
            # RBAC is cached for a moment: retry while the answer is still RBAC's.
            for label, attempt in guard_only.items():
                out = attempt()
                for _ in range(20):
                    if out.returncode == 0 or "cannot" not in out.stderr:
                        break
                    time.sleep(0.5)
                    out = attempt()
                hostile[label] = out
        finally:
            sec.cluster.kubectl("delete", "role,rolebinding", widened, "-n", ns, check=False)
        after = kubectl_json(sec.cluster, "get", "lease", other, "-n", ns)
    expect = {
        "create another node's Lease": "may only write its own Lease",
        "renew another node's Lease": "may only write its own Lease",
        "replace another node's Lease": 'cannot update resource "leases"',
        "delete another node's Lease": 'cannot delete resource "leases"',
        "create the controller's leader Lease": "may only write its own Lease",
        "replace, Role widened": "may only write its own Lease",
        "delete, Role widened": "may only write its own Lease",
    }
    wrong = [
        f"{label}: {'written' if out.returncode == 0 else out.stderr.strip()}"
        for label, out in hostile.items()
        if out.returncode == 0 or expect[label] not in out.stderr
    ]
    denied_own = [f"{k}: {o.stderr.strip()}" for k, o in own_writes.items() if o.returncode]
    kept = before["spec"] == after["spec"] and before["metadata"]["uid"] == after["metadata"]["uid"]
    why = " | ".join(
        f"{label}: {out.stderr.strip().rsplit('denied request: ', 1)[-1][:200]}"
        for label, out in hostile.items()
    )
    if wrong or denied_own or not kept:
        return False, (
            f"not refused as expected: {wrong}; own Lease refused: {denied_own}; "
            f"other node's Lease unchanged: {kept} | {why}"
        )
    return True, f"own Lease created and renewed; the other node's Lease unchanged | {why}"


def _tenant_may_write_leases(sec: Sec) -> None:
    """A namespace owner's rights over Leases of its own namespace (its own leader election)."""
    sec.cluster.kubectl(
        "create", "role", "lease-owner", "-n", sec.attacker_ns,
        "--verb=get,list,watch,create,patch,update,delete", "--resource=leases",
        check=False,
    )  # fmt: skip
    sec.cluster.kubectl(
        "create", "rolebinding", "lease-owner", "-n", sec.attacker_ns, "--role=lease-owner",
        f"--serviceaccount={sec.attacker_ns}:tenant", check=False,
    )  # fmt: skip
    may(sec, sec.tenant, "create", "leases.coordination.k8s.io", sec.attacker_ns)


def a_tenant_writes_an_agent_lease_in_the_release_namespace(sec: Sec) -> Outcome:
    """A tenant, owning Leases of its own namespace, writes the node agent's Lease where the
    controller reads it (the release namespace; this harness's LEASE_NS): create, renew with a
    huge duration, delete. RBAC gives tenants nothing there."""
    _tenant_may_write_leases(sec)
    lease = agent_lease_name(sec.cluster.node_name)
    assert lease is not None
    renew = {"spec": {"renewTime": _now(), "leaseDurationSeconds": 2147483647}}
    tries = {}
    for ns in (sec.agent_ns, LEASE_NS):
        doc = _lease_doc(lease, f"gpushare-node-agent/{sec.cluster.node_name}", _now(), 3600)
        tries[f"create {ns}/{lease}"] = sec.kubectl(
            "create", "-n", ns, "-f", "-", as_tenant=True, stdin=json.dumps(doc)
        )
    # A PATCH as the tenant's token, as its pods would send it (kubectl patch GETs first).
    tries[f"renew {LEASE_NS}/{lease}"] = patch_as_token(
        sec, tenant_token(sec), lease_path(LEASE_NS, lease), renew
    )
    tries[f"delete {LEASE_NS}/{lease}"] = sec.kubectl(
        "delete", "lease", lease, "-n", LEASE_NS, as_tenant=True
    )
    wrong = [k for k, out in tries.items() if out.returncode == 0 or "forbidden" not in out.stderr]
    spec = kubectl_json(sec.cluster, "get", "lease", lease, "-n", LEASE_NS)["spec"]
    why = " | ".join(f"{k}: {out.stderr.strip()[:220]}" for k, out in tries.items())
    ok = not wrong and spec.get("leaseDurationSeconds") != 2147483647
    return ok, (why if ok else f"not refused: {wrong}; Lease now {spec} | {why}")


def _tenant_lease(sec: Sec, renew: str, duration: int = 1) -> Any:
    """The tenant's Lease named like this node's agent's, in its own namespace, written
    (created or replaced) with ``renew`` and ``duration``."""
    lease = agent_lease_name(sec.cluster.node_name)
    assert lease is not None
    doc = _lease_doc(lease, f"gpushare-node-agent/{sec.cluster.node_name}", renew, duration)
    doc["metadata"]["namespace"] = sec.attacker_ns
    return sec.kubectl("apply", "-f", "-", as_tenant=True, stdin=json.dumps(doc))


def a_tenant_lease_named_like_an_agents_marks_a_live_node_dead(sec: Sec) -> Outcome:
    """A tenant's Lease gpushare-agent-<node> in its own namespace, renewed long ago with a
    1 s duration, written twice and deleted and written again: were the controller to read it,
    the node of a live agent would be refused to every tenant. It reads only the release
    namespace's (and since this round ignores a Lease of any other namespace, and refuses to
    start reading every namespace): the node stays offered and a new pod runs there."""
    _tenant_may_write_leases(sec)
    writes = [_tenant_lease(sec, "2000-01-01T00:00:00.000000Z")]
    writes.append(_tenant_lease(sec, "2000-01-01T00:00:01.000000Z"))
    lease = agent_lease_name(sec.cluster.node_name)
    assert lease is not None
    writes.append(sec.kubectl("delete", "lease", lease, "-n", sec.attacker_ns, as_tenant=True))
    writes.append(_tenant_lease(sec, "2000-01-01T00:00:02.000000Z"))
    failed = [w.stderr.strip() for w in writes if w.returncode]
    assert not failed, f"the tenant could not write its own Lease: {failed}"
    time.sleep(4)  # beyond its 1 s duration and the controller's 1 s judging
    offered, refusal = node_verdict(sec)
    node = placed_in_victim_namespace(sec)
    return offered and node == sec.cluster.node_name, (
        f"{sec.attacker_ns}/{lease} (renewTime 2000-01-01, leaseDurationSeconds 1) ignored: the "
        f"controller reads agents' Leases of {LEASE_NS} only; the node stayed offered "
        f"({offered}{', ' + refusal if refusal else ''}) and a new pod ran on {node or 'nothing'}"
    )


def a_tenant_lease_named_like_an_agents_keeps_a_dead_agents_node(sec: Sec) -> Outcome:
    """The node agent is SIGKILLed; the tenant renews its own namespace's Lease named like
    the agent's every second: were the controller to read it, the dead agent's node would keep
    getting pods nobody Allocates. The node is refused within the agent's Lease duration and
    a new pod waits with the reason, then runs once a new agent renews the real Lease."""
    _tenant_may_write_leases(sec)
    stop = threading.Event()
    renewals: list[int] = []

    def renew() -> None:
        while not stop.is_set():
            renewals.append(_tenant_lease(sec, _now(), 3600).returncode)
            stop.wait(1)

    name = f"dead-{uuid.uuid4().hex[:4]}"
    renewer = threading.Thread(target=renew, daemon=True)
    with agent_killed(sec) as killed:
        renewer.start()
        try:
            refusal = wait_until(
                lambda: (v := node_verdict(sec)) and not v[0] and AGENT_GONE in v[1] and v[1],
                timeout_s=30,
            )
            refused_after = time.monotonic() - killed
            doc = pod_doc(name, sec.cluster.busybox_image, annotations={ANN_FRACTION: "0.05"})
            sec.cluster.kubectl("apply", "-n", sec.victim_ns, "-f", "-", input=json.dumps(doc))
            message = scheduling_message(sec, sec.victim_ns, name, timeout_s=30)
            bound = sec.pod(sec.victim_ns, name)["spec"].get("nodeName")
        finally:
            stop.set()
            renewer.join(15)
    try:
        ran = running(sec, sec.victim_ns, name)["spec"].get("nodeName")
    finally:
        sec.cluster.kubectl("delete", "pod", name, "-n", sec.victim_ns, "--wait=false")
    # The pod's event names the dead agent (the extender), or, once the kubelet emptied the
    # node's allocatable, kube-scheduler's own fit refuses the node first (docs/node-agent.md,
    # "A dead agent").
    said_why = AGENT_GONE in message or f"Insufficient {RESOURCE_GPU_PERCENT}" in message
    ok = bool(refusal) and said_why and not bound and bool(ran)
    return ok, (
        f"{renewals.count(0)} renewals of {sec.attacker_ns}/gpushare-agent-"
        f"{sec.cluster.node_name} ignored; the node was refused {refused_after:.1f} s after the "
        f"kill ({str(refusal)[:220]}); a new pod waited ({message[:120]}) and ran once a new "
        "agent renewed the real Lease"
    )


def a_hostile_lease_spec_keeps_a_dead_agents_node_alive(sec: Sec) -> Outcome:
    """Whoever holds this node's agent token (stolen from its pod) may write the node's Lease:
    that is the agent's own right. Wrong types never reach the controller (the API server
    refuses them); a huge leaseDurationSeconds with a renewTime in the year 9999, written once
    right after the agent is SIGKILLed, keeps its node for at most the controller's bound
    (--agent-lease-max-seconds, 60 s by default and AGENT_LEASE_MAX_SECONDS here, on its own
    clock, renewTime never compared) after that write, not for 68 years.
    Renewing on and on is the agent's right too: a token bound to the agent's pod stops
    working once the pod is gone (a_stolen_agent_token_after_its_pod_is_gone), and the
    kubelet's allocatable count still judges a node whose device plugin is gone."""
    node = sec.cluster.node_name
    lease = agent_lease_name(node)
    assert lease is not None
    with chart_agent_rbac(sec):
        token = agent_pod_token(sec, "agent-lease")

        def patch(spec: Any) -> Any:
            return patch_as_token(sec, token, lease_path(LEASE_NS, lease), {"spec": spec})

        wrong_types = {
            "leaseDurationSeconds as a string": {"leaseDurationSeconds": "2147483647"},
            "leaseDurationSeconds beyond int32": {"leaseDurationSeconds": 2**40},
            "leaseDurationSeconds 0": {"leaseDurationSeconds": 0},
            "leaseDurationSeconds -5": {"leaseDurationSeconds": -5},
            "renewTime not a time": {"renewTime": "forever"},
            "spec a list": ["renewTime"],
        }
        typed = {label: patch(spec) for label, spec in wrong_types.items()}
        stored = [k for k, out in typed.items() if out.returncode == 0]
        hostile = {
            "leaseDurationSeconds": 2147483647,
            "renewTime": "9999-12-31T23:59:59.999999Z",
            "holderIdentity": f"gpushare-node-agent/{node}",
        }
        with agent_killed(sec):
            written = patch(hostile)
            wrote = time.monotonic()
            assert written.returncode == 0, f"the agent's token could not write: {written.stderr}"
            first_refusal: tuple[float, str] | None = None
            gone: tuple[float, str] | None = None
            while time.monotonic() - wrote < AGENT_LEASE_MAX_SECONDS + 30 and gone is None:
                offered, why = node_verdict(sec)
                at = time.monotonic() - wrote
                if not offered and first_refusal is None:
                    first_refusal = (at, why)
                if AGENT_GONE in why:
                    gone = (at, why)
                time.sleep(0.5)
    # The controller's bound, and one agent duration for the watch and check.
    bound = AGENT_LEASE_MAX_SECONDS + 6
    said = f"{AGENT_LEASE_MAX_SECONDS} s"
    ok = not stored and gone is not None and gone[0] <= bound and said in gone[1]
    types_why = "; ".join(
        f"{k}: {o.stderr.strip().rsplit(': ', 1)[-1][:60]}" for k, o in typed.items()
    )
    first = (
        f"{first_refusal[0]:.0f} s after the write ({first_refusal[1][:90]})"
        if first_refusal
        else "never"
    )
    # The measured times first: the reason is kept to 600 characters in attacks.json.
    return ok, (
        f"{LEASE_NS}/{lease} given leaseDurationSeconds 2147483647 and renewTime 9999-12-31 "
        "with the agent's token right after the agent was killed: the controller judged the "
        "agent gone "
        + (f"{gone[0]:.0f} s after that write" if gone else f"never within {bound + 24} s")
        + f" (bound {bound} s: durations bounded to 1..{said}, renewals timed on its own clock); "
        f"the node was first refused {first}. Wrong types refused by the API server, "
        f"stored: {len(stored)} ({types_why})"
    )


def a_tenant_service_account_named_like_the_node_agent(sec: Sec) -> Outcome:
    """A namespace owner may create ServiceAccounts and their tokens in its namespace: one
    named like the node agent's, its token bound to a pod the tenant runs on this node (so the
    token even carries this node's claim). The guard policy and the agent's RBAC name the
    release namespace's ServiceAccount, so this one may write no Lease, node or pod of the
    agent; nor may the tenant mint a token of the real agent ServiceAccount."""
    sa = _agent_sa(sec)
    ns = sec.attacker_ns
    sec.cluster.kubectl(
        "create", "role", "sa-owner", "-n", ns, "--verb=get,create",
        "--resource=serviceaccounts,serviceaccounts/token", check=False,
    )  # fmt: skip
    sec.cluster.kubectl(
        "create", "rolebinding", "sa-owner", "-n", ns, "--role=sa-owner",
        f"--serviceaccount={ns}:tenant", check=False,
    )  # fmt: skip
    may(sec, sec.tenant, "create", "serviceaccounts", ns)
    made = sec.kubectl("create", "serviceaccount", sa, "-n", ns, as_tenant=True)
    assert made.returncode == 0 or "already exists" in made.stderr, made.stderr
    name = f"lookalike-{uuid.uuid4().hex[:4]}"
    doc = pod_doc(name, sec.cluster.busybox_image, spec={"serviceAccountName": sa})
    # A ServiceAccount just made may not be known to pod admission for a moment.
    outcome = wait_until(lambda: (o := create(sec, doc)) and not o[0] and o, timeout_s=30)
    assert outcome, f"the tenant's pod with ServiceAccount {sa} was never created"
    try:
        running(sec, ns, name)
        minted = sec.kubectl(
            "create", "token", sa, "-n", ns, "--bound-object-kind", "Pod",
            "--bound-object-name", name, as_tenant=True,
        )  # fmt: skip
        assert minted.returncode == 0, minted.stderr
        token = minted.stdout.strip()
        lease = agent_lease_name(sec.cluster.node_name)
        assert lease is not None
        renew = {"spec": {"renewTime": _now()}}
        tries = {
            "renew the agent's Lease": patch_as_token(
                sec, token, lease_path(LEASE_NS, lease), renew
            ),
            "create it in the release namespace": as_token(
                sec, token, "create", "-n", sec.agent_ns, "-f", "-",
                stdin=json.dumps(_lease_doc(lease, "x", _now())),
            ),
            "annotate the node": patch_as_token(
                sec, token, f"/api/v1/nodes/{sec.cluster.node_name}",
                {"metadata": {"annotations": {"gs-sec/lookalike": "1"}}},
            ),
            "mint a token of the real agent": sec.kubectl(
                "create", "token", sa, "-n", sec.agent_ns, as_tenant=True
            ),
        }  # fmt: skip
    finally:
        sec.kubectl("delete", "pod", name, "-n", ns, "--wait=false")
    wrong = [k for k, out in tries.items() if out.returncode == 0 or "forbidden" not in out.stderr]
    why = " | ".join(f"{k}: {out.stderr.strip()[:200]}" for k, out in tries.items())
    return not wrong, (why if not wrong else f"not refused: {wrong} | {why}")


def a_stolen_agent_token_after_its_pod_is_gone(sec: Sec) -> Outcome:
    """A node agent's token taken from its pod (the kubelet mounts one bound to the pod) could
    renew its node's Lease for ever, keeping a node whose agent is gone looking alive. Bound
    to the pod, it stops working once the pod is deleted: the API server answers 401."""
    lease = agent_lease_name(sec.cluster.node_name)
    assert lease is not None
    pod = f"agent-gone-{uuid.uuid4().hex[:4]}"
    with chart_agent_rbac(sec):
        token = agent_pod_token(sec, pod)

        def mark() -> Any:
            body = {"metadata": {"annotations": {"gs-sec/stolen": uuid.uuid4().hex[:4]}}}
            return patch_as_token(sec, token, lease_path(LEASE_NS, lease), body)

        try:
            before = mark()
            sec.cluster.kubectl("delete", "pod", pod, "-n", sec.agent_ns, "--wait=true")
            after = wait_until(lambda: (out := mark()).returncode != 0 and out, timeout_s=30)
        finally:
            sec.cluster.kubectl(
                "annotate", "lease", lease, "-n", LEASE_NS, "gs-sec/stolen-", check=False
            )
    ok = before.returncode == 0 and bool(after) and "nauthorized" in after.stderr
    return ok, (
        f"while pod {sec.agent_ns}/{pod} ran the token wrote {LEASE_NS}/{lease} "
        f"({before.returncode == 0}: {before.stderr.strip()[:100]}); once it was deleted: "
        + (after.stderr.strip()[:200] if after else "still written 30 s later")
    )


def tenant_annotates(sec: Sec, name: str, change: str) -> Outcome:
    """The tenant's ``kubectl annotate --overwrite`` of its own pod."""
    out = sec.kubectl(
        "annotate", "--overwrite", "-n", sec.attacker_ns, "pod", name, change, as_tenant=True
    )
    return out.returncode != 0, out.stderr.strip()


def tenant_running_pod(sec: Sec, fraction: str) -> str:
    """The tenant's own placed, running pod (one per fraction, made once)."""
    name = f"own-{fraction.replace('.', '')}"
    try:
        sec.pod(sec.attacker_ns, name)
    except AssertionError:
        refused, why = create(
            sec, pod_doc(name, sec.cluster.busybox_image, annotations={ANN_FRACTION: fraction})
        )
        assert not refused, why
    running(sec, sec.attacker_ns, name)
    return name


# ---- issue 67: quota, /proc paths, the webhook's and the agents' ports ------------------


def opts_in_past_its_quota(sec: Sec) -> Outcome:
    """Issue 67: opted-in pods ask for the opportunistic resource, which a ResourceQuota on
    gpu-percent does not count, yet one that fitted was bound as a guaranteed share: a tenant
    at its quota held more guaranteed share than it. Now, under a quota of 50, three opted-in
    pods of 0.5 hold at most 50 guaranteed; the others wait, saying why."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpus", "namespace": sec.attacker_ns},
        "spec": {"hard": {"requests.gpushare.io/gpu-percent": "50"}},
    }
    sec.kubectl("apply", "-f", "-", stdin=json.dumps(quota))
    names = [f"optq-{uuid.uuid4().hex[:4]}" for _ in range(3)]
    try:
        for name in names:
            refused, why = create(
                sec,
                pod_doc(
                    name,
                    sec.cluster.busybox_image,
                    annotations={ANN_FRACTION: "0.5", ANN_OPPORTUNISTIC: "true"},
                ),
            )
            if refused:
                return False, f"{name} refused at creation: {why}"

        def settled() -> list[dict[str, Any]] | None:
            pods = [sec.pod(sec.attacker_ns, n) for n in names]
            bound = [p for p in pods if p["spec"].get("nodeName")]
            return pods if len(bound) >= 1 else None

        wait_until(settled, timeout_s=60)
        time.sleep(10)  # the others' filter rounds
        pods = [sec.pod(sec.attacker_ns, n) for n in names]
        guaranteed = [
            p["metadata"]["name"]
            for p in pods
            if p["spec"].get("nodeName")
            and p["metadata"].get("annotations", {}).get(ANN_TIER) != "opportunistic"
        ]
        waiting = [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")]
        message = scheduling_message(sec, sec.attacker_ns, waiting[0]) if waiting else ""
        ok = len(guaranteed) * 50 <= 50 and (not waiting or "ResourceQuota" in message)
        return ok, (
            f"quota 50: {len(guaranteed)} opted-in pods of 0.5 bound guaranteed "
            f"({', '.join(guaranteed)}); waiting: {len(waiting)} ({message[:200]})"
        )
    finally:
        for name in names:
            sec.kubectl("delete", "pod", name, "-n", sec.attacker_ns, "--wait=false")
        sec.kubectl("delete", "resourcequota", "gpus", "-n", sec.attacker_ns)


def a_plain_pod_mounts_the_host_through_proc(sec: Sec) -> Outcome:
    """Issue 67: /proc/1/root/... passed the host-path guard (a process's root is the host's
    file system). Now the policy refuses /proc, /proc/<pid> and every path through a
    process's root or working directory."""
    reasons = []
    for path in ("/proc/1/root/var/lib/kubelet/device-plugins", "/proc/self/root", "/proc/1"):
        name = f"proc-mount-{uuid.uuid4().hex[:4]}"
        doc = pod_doc(
            name,
            sec.cluster.busybox_image,
            container={"volumeMounts": [{"name": "h", "mountPath": "/h"}]},
            spec={"volumes": [{"name": "h", "hostPath": {"path": path}}]},
        )
        refused, why = create(sec, doc)
        if not refused:
            sec.kubectl("delete", "pod", name, "-n", sec.attacker_ns, "--wait=false")
            return False, f"a plain pod mounting {path} was created"
        # The policy for gpushare's pods says "a protected host directory", the one for other
        # pods (otherPods: deny here) "a host directory gpushare protects".
        if "host directory" not in why or "protect" not in why:
            return False, f"{path}: refused for another reason: {why}"
        reasons.append(why)
    return True, reasons[0]


def _webhook_post(sec: Sec, body: bytes, headers: dict[str, str] | None = None) -> int:
    """POST /mutate to the controller's webhook port as any pod could (no client proof)."""
    import ssl  # noqa: PLC0415

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(
        f"https://127.0.0.1:{sec.controller.webhook_port}/mutate",
        data=body,
        headers=headers or {},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=15, context=context) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def sends_the_webhook_bodies_it_cannot_parse_cheaply(sec: Sec) -> Outcome:
    """Issue 67: an undecodable Content-Encoding gave 500 (228 of the last fuzz's uncaught
    inputs), and one review of 4 million integers held the controller's loop for over a
    second. Now: 415 for a Content-Encoding, 413 for a review of over 200,000 values (before
    parsing) or over 4 MiB (before reading), each at once, and the extender answers
    meanwhile."""
    gzip = _webhook_post(sec, b"\x1f\x8bnot gzip", {"Content-Encoding": "gzip"})
    ints = b"1," * 1_900_000
    started = time.monotonic()
    many = _webhook_post(sec, b'{"kind":"AdmissionReview","x":[' + ints + b"1]}")
    many_s = time.monotonic() - started
    status, _ = post("filter", {"Pod": pod_doc("probe", "busybox"), "NodeNames": []})
    ok = gzip == 415 and many == 413 and many_s < 5 and status == 200
    return ok, (
        f"gzip body: HTTP {gzip}; review of 1.9 million integers: HTTP {many} after "
        f"{many_s:.2f} s; the extender's filter meanwhile: HTTP {status}"
    )


def holds_every_agent_connection_from_one_pod(sec: Sec) -> Outcome:
    """Issue 67: one pod holding the agent's 64 connections failed its liveness probe 0/9
    (the agent restarted over and over) and left the bind check without a verdict. Now one
    address holds at most 8: the probes of another are answered throughout."""
    import socket  # noqa: PLC0415

    port = sec.agent.metrics_port
    held = []
    try:
        for _ in range(200):
            try:
                held.append(
                    socket.create_connection(
                        ("127.0.0.1", port), timeout=2, source_address=("127.0.0.2", 0)
                    )
                )
            except OSError:
                break
        answered = 0
        for _ in range(9):
            try:
                status, _ = _get(f"http://127.0.0.1:{port}/healthz", None)
                answered += status == 200
            except OSError:
                pass
            time.sleep(0.2)
    finally:
        for s in held:
            s.close()
    return answered == 9, f"/healthz answered {answered}/9 while one address held 200 connections"


def floods_the_agent_with_made_up_tokens(sec: Sec) -> Outcome:
    """Issue 67: every made-up bearer token cost a TokenReview (unbounded API-server load).
    Now one address gets at most 10 unknown tokens reviewed a minute; the rest get 429 without
    a review."""
    port = sec.agent.metrics_port
    statuses = Counter(
        _get(f"http://127.0.0.1:{port}/metrics", f"made-up-{uuid.uuid4().hex}")[0]
        for _ in range(60)
    )
    return statuses[429] >= 45 and statuses[200] == 0, f"60 made-up tokens: {dict(statuses)}"


ATTACKS: dict[str, Callable[[Sec], Outcome]] = {
    f.__name__: f
    for f in (
        a_forged_bind_of_a_pod_of_another_scheduler,
        a_forged_plain_bind_of_a_pod_without_gpu_request,
        a_forged_bind_to_a_node_filter_never_offered,
        forged_filter_calls_hold_capacity,
        oversized_and_deep_bodies,
        patch_running_request_down,
        patch_request_through_pod_status,
        patch_thread_share,
        patch_placement_onto_the_victims_gpu,
        patch_state_back_to_assumed,
        patch_on_exclusive_policy,
        create_with_profiling_true,
        create_with_a_fake_profile,
        create_exclusive_without_the_grant,
        gpu_request_in_an_init_container,
        share_the_victims_gpu_from_another_namespace,
        env_reexports_the_thread_cap,
        mounts_the_mps_directories,
        a_plain_pod_mounts_the_kubelet_plugin_and_cdi_directories,
        skips_the_scheduler_with_node_name,
        writes_its_own_placement_at_creation,
        forges_mps_fault_lines_from_its_container,
        a_node_agent_token_for_another_nodes_pods,
        extender_without_client_certificate,
        a_pod_asking_for_an_exponent_near_a_million_cpus,
        reads_metrics_and_profiles_with_a_tenant_token,
        holds_the_agents_port_with_idle_connections,
        opts_a_latency_pod_into_opportunistic_placement,
        asks_for_opportunistic_slices_without_the_opt_in,
        opts_a_two_gpu_pod_into_opportunistic_placement,
        forges_its_tier_at_creation,
        patches_its_tier_to_hide_its_share,
        patches_its_opt_in_after_admission,
        huge_quantities_in_each_gpu_resource_field,
        huge_host_quantities_in_a_gpu_pod,
        names_another_namespaces_gpushare,
        forges_namespace_grant_labels_on_the_pod,
        creates_a_pod_in_the_release_namespace,
        gives_a_second_container_a_gpu_share,
        points_the_gpu_container_at_one_that_is_not_there,
        loads_mps_variables_through_env_from,
        asks_for_whole_nvidia_gpus_beside_its_share,
        odd_spellings_of_its_request,
        routes_around_gpushare_scheduler_with_the_default_scheduler,
        another_nodes_agent_writes_renews_or_deletes_a_lease,
        a_tenant_writes_an_agent_lease_in_the_release_namespace,
        a_tenant_lease_named_like_an_agents_marks_a_live_node_dead,
        a_tenant_lease_named_like_an_agents_keeps_a_dead_agents_node,
        a_hostile_lease_spec_keeps_a_dead_agents_node_alive,
        a_tenant_service_account_named_like_the_node_agent,
        a_stolen_agent_token_after_its_pod_is_gone,
        opts_in_past_its_quota,
        a_plain_pod_mounts_the_host_through_proc,
        sends_the_webhook_bodies_it_cannot_parse_cheaply,
        holds_every_agent_connection_from_one_pod,
        floods_the_agent_with_made_up_tokens,
        declares_its_running_pod_finished,  # last: it ends the tenant's running pod
    )
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_attack_is_refused_with_a_reason_and_disturbs_no_one(sec: Sec, attack: str) -> None:
    before = victim_state(sec)
    refused, reason = ATTACKS[attack](sec)
    after = victim_state(sec)
    RESULTS[attack] = {
        "refused": refused,
        "reason": reason[:600],
        "victim_undisturbed": before == after,
    }
    assert refused, f"{attack} succeeded: {reason}"
    assert reason, f"{attack} was refused without a reason"
    assert before == after, f"{attack} disturbed the victim: {before} -> {after}"
