"""gpushare-scheduler (the stock kube-scheduler calling our extender) on the local cluster, with
the node agent on simulated GPUs: fractional pods land on the GPU their annotations name, no GPU
is ever oversubscribed, misfits stay Pending with the reason, the webhook refuses bad pods, and
a controller killed mid-burst loses and double-books nothing."""

import json
import subprocess
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gpushare.api.inventory import GpuInfo, load_inventory
from gpushare.api.names import (
    ANN_CLASS,
    ANN_FRACTION,
    ANN_GPU_UUID,
    ANN_LIMIT,
    ANN_MEMORY,
    ANN_NODE_GPUS,
    ANN_REQUEUED_AT,
    RESOURCE_GPU_PERCENT,
    SCHEDULER_NAME,
)
from gpushare.api.placement import parse_placement
from gpushare.api.quantities import parse_fraction, parse_memory
from gpushare.cluster.extender.base import HOLD_SECONDS
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.controller import ControllerProcess, served_namespace
from tests.fixtures.node_agent import NodeAgentProcess, scraper_token

pytestmark = pytest.mark.cluster

Pod = dict[str, Any]


@dataclass
class GpuNode:
    name: str
    gpus: list[GpuInfo]


def _node(cluster: LocalCluster) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", "node", cluster.node_name, "-o", "json"))  # type: ignore[no-any-return]


def _inventory_ready(cluster: LocalCluster) -> list[GpuInfo] | None:
    node = _node(cluster)
    text = node["metadata"].get("annotations", {}).get(ANN_NODE_GPUS)
    allocatable = int(node["status"].get("allocatable", {}).get(RESOURCE_GPU_PERCENT, "0"))
    if text is None or allocatable < 100:
        return None
    gpus = load_inventory(text)
    return gpus if allocatable == 100 * len(gpus) else None


@pytest.fixture(scope="module")
def gpu_node(cluster: LocalCluster, node_agent: NodeAgentProcess) -> GpuNode:
    """The node with the shared node agent advertising its two simulated H100s."""
    deadline = time.monotonic() + 90
    gpus = _inventory_ready(cluster)
    while gpus is None and time.monotonic() < deadline:
        time.sleep(1)
        gpus = _inventory_ready(cluster)
    if gpus is None:
        pytest.fail(f"node never advertised its simulated GPUs:\n{node_agent.log_text()[-2000:]}")
    return GpuNode(cluster.node_name, gpus)


@pytest.fixture
def namespace(cluster: LocalCluster, controller: ControllerProcess) -> Iterator[str]:
    with served_namespace(cluster, controller, "gs-sched") as name:
        yield name


@pytest.fixture(scope="module")
def refusing_namespace(cluster: LocalCluster, controller: ControllerProcess) -> Iterator[str]:
    """One namespace for the webhook's refusals: a refused pod is never created, so the cases
    leave it as they found it (and it goes once, not once per case)."""
    with served_namespace(cluster, controller, "gs-refuse") as name:
        yield name


def gpushare_pod(
    cluster: LocalCluster, name: str, fraction: str, *, memory: str | None = None, **spec: Any
) -> Pod:
    annotations = {ANN_FRACTION: fraction}
    if memory is not None:
        annotations[ANN_MEMORY] = memory
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": cluster.busybox_image,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "resources": {"requests": {"cpu": "1m", "memory": "4Mi"}},
                }
            ],
            **spec,
        },
    }


def create(cluster: LocalCluster, namespace: str, pods: list[Pod]) -> None:
    doc = {"apiVersion": "v1", "kind": "List", "items": pods}
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(doc))


def list_pods(cluster: LocalCluster, *args: str) -> list[Pod]:
    return json.loads(cluster.kubectl("get", "pods", *args, "-o", "json"))["items"]  # type: ignore[no-any-return]


def scheduling_failure(
    cluster: LocalCluster, namespace: str, name: str, *, timeout_s: float = 60
) -> str:
    """The pod's FailedScheduling messages, once one from gpushare is there (or the timeout)."""
    deadline = time.monotonic() + timeout_s
    message = ""
    while time.monotonic() < deadline and "gpushare" not in message:
        events = cluster.events(namespace, name=name, reason="FailedScheduling")
        message = " ".join(e.get("message", "") for e in events)
        if "gpushare" not in message:
            time.sleep(0.5)
    return message


def wait_bound(
    cluster: LocalCluster, namespace: str, count: int, *, timeout: float = 180
) -> list[Pod]:
    deadline = time.monotonic() + timeout
    pods: list[Pod] = []
    while time.monotonic() < deadline:
        pods = list_pods(cluster, "-n", namespace)
        bound = [
            p
            for p in pods
            if p["spec"].get("nodeName") and ANN_GPU_UUID in p["metadata"].get("annotations", {})
        ]
        if len(bound) >= count:
            return pods
        time.sleep(1)
    pending = [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")]
    raise AssertionError(f"only {count - len(pending)}/{count} bound after {timeout}s: {pending}")


def assert_no_gpu_oversubscribed(cluster: LocalCluster, node: GpuNode) -> dict[str, list[str]]:
    """Over every live pod in the cluster (not only ours): guaranteed shares <= 100% and
    memory limits <= the GPU's memory, each pod on the node that owns the GPU it names."""
    by_gpu = {g.uuid: g for g in node.gpus}
    percent: dict[str, int] = defaultdict(int)
    memory: dict[str, int] = defaultdict(int)
    tenants: dict[str, list[str]] = defaultdict(list)
    for pod in list_pods(cluster, "-A"):
        if pod["status"].get("phase") in ("Succeeded", "Failed"):
            continue
        ann = pod["metadata"].get("annotations", {})
        placement = parse_placement(ann)
        if placement is None:
            continue
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        for uuid_ in placement.gpu_uuids:
            assert uuid_ in by_gpu, f"{key} names GPU {uuid_}, not on node {node.name}"
            if pod["spec"].get("nodeName"):
                assert pod["spec"]["nodeName"] == node.name, key
            share = (
                parse_fraction(ann[ANN_FRACTION], field=ANN_FRACTION)
                if ANN_FRACTION in ann
                else 100
            )
            percent[uuid_] += min(share, 100)
            memory[uuid_] += placement.memory_limit_bytes
            tenants[uuid_].append(key)
    for uuid_, total in percent.items():
        assert total <= 100, f"GPU {uuid_} oversubscribed: {total}% for {tenants[uuid_]}"
        assert memory[uuid_] <= by_gpu[uuid_].memory_bytes, f"GPU {uuid_} memory oversubscribed"
    return tenants


def mixed_pods(cluster: LocalCluster, count: int, prefix: str) -> list[Pod]:
    """Sizes cycle 8%, 4% (4Gi), 2%, 1%: 40 pods take 150% and 128Gi of two 80GB GPUs."""
    sizes: list[tuple[str, str | None]] = [
        ("0.08", None),
        ("4%", "4Gi"),
        ("0.02", None),
        ("1%", None),
    ]
    return [
        gpushare_pod(
            cluster,
            f"{prefix}-{i:02d}",
            sizes[i % len(sizes)][0],
            memory=sizes[i % len(sizes)][1],
        )
        for i in range(count)
    ]


def test_forty_fractional_pods_land_on_the_gpu_their_annotations_name(
    cluster: LocalCluster, controller: ControllerProcess, gpu_node: GpuNode, namespace: str
) -> None:
    create(cluster, namespace, mixed_pods(cluster, 40, "frac"))
    pods = wait_bound(cluster, namespace, 40)
    tenants = assert_no_gpu_oversubscribed(cluster, gpu_node)
    assert sum(len(t) for t in tenants.values()) >= 40
    for pod in pods:
        ann = pod["metadata"]["annotations"]
        placement = parse_placement(ann)
        assert placement is not None and len(placement.gpu_uuids) == 1
        assert pod["spec"]["schedulerName"] == SCHEDULER_NAME
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits[RESOURCE_GPU_PERCENT] == str(
            parse_fraction(ann[ANN_FRACTION], field=ANN_FRACTION)
        )
        if ANN_MEMORY in ann:
            assert placement.memory_limit_bytes == parse_memory(ann[ANN_MEMORY], field=ANN_MEMORY)
    assert_each_runs_on_its_gpu(cluster, namespace, 40)


def assert_each_runs_on_its_gpu(cluster: LocalCluster, namespace: str, count: int) -> None:
    """The kubelet runs each pod with the GPU and thread share the scheduler chose (the node
    agent reads the placement annotations at Allocate): look inside every container."""
    deadline = time.monotonic() + 120
    running: list[Pod] = []
    while time.monotonic() < deadline:
        running = [
            p
            for p in list_pods(cluster, "-n", namespace)
            if p["status"].get("phase") == "Running"
            and ANN_FRACTION in p["metadata"].get("annotations", {})
        ]
        if len(running) == count:
            break
        time.sleep(2)
    assert len(running) == count, f"only {len(running)}/{count} pods reached Running"
    for pod in running:
        env = cluster.kubectl("exec", "-n", namespace, pod["metadata"]["name"], "--", "env")
        ann = pod["metadata"]["annotations"]
        lines = env.splitlines()
        assert f"CUDA_VISIBLE_DEVICES={ann[ANN_GPU_UUID]}" in lines, pod["metadata"]["name"]
        threads = ann["gpushare.io/active-thread-percentage"]
        assert f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={threads}" in lines, pod["metadata"]["name"]


def test_burstable_pods_run_at_their_limit_with_the_request_recorded(
    cluster: LocalCluster, controller: ControllerProcess, gpu_node: GpuNode, namespace: str
) -> None:
    """Request and limit end to end: the webhook accepts the limit, bind records the request
    beside the effective cap, and the container runs with that cap and memory for its
    request. A batch pod alone on a GPU, or beside batch pods, is not throttled; one placed
    where a latency pod runs is kept to half the GPU."""
    service = gpushare_pod(cluster, "svc", "0.1")
    service["metadata"]["annotations"][ANN_CLASS] = "latency"
    create(cluster, namespace, [service])
    wait_bound(cluster, namespace, 1)
    burst = gpushare_pod(cluster, "burst", "0.3")
    limited = gpushare_pod(cluster, "limited", "0.2")
    limited["metadata"]["annotations"][ANN_LIMIT] = "40%"
    create(cluster, namespace, [burst, limited])
    pods = {p["metadata"]["name"]: p for p in wait_bound(cluster, namespace, 3)}
    latency_gpu = parse_placement(pods["svc"]["metadata"]["annotations"])
    assert latency_gpu is not None and latency_gpu.thread_percent == 100
    for name, request, limit in (("burst", 30, 100), ("limited", 20, 40)):
        placement = parse_placement(pods[name]["metadata"]["annotations"])
        assert placement is not None and placement.request_percent == request, name
        beside_latency = placement.gpu_uuids == latency_gpu.gpu_uuids
        expected = min(limit, 50) if beside_latency else limit
        assert placement.thread_percent == expected, (name, placement)
        assert placement.memory_limit_bytes == gpu_node.gpus[0].memory_bytes * request // 100
    assert_each_runs_on_its_gpu(cluster, namespace, 3)


def test_a_gpu_node_tainted_as_gke_taints_it_still_runs_gpushare_pods(
    cluster: LocalCluster, controller: ControllerProcess, gpu_node: GpuNode, namespace: str
) -> None:
    """GKE taints GPU nodes nvidia.com/gpu=present:NoSchedule and tolerates it only for pods
    asking nvidia.com/gpu; the webhook's default toleration lets a gpushare pod run there
    (docs/scheduling.md, "Admission webhook"). A pod that is not a gpushare pod stays off."""
    taint = "nvidia.com/gpu=present:NoSchedule"
    cluster.kubectl("taint", "node", gpu_node.name, taint, "--overwrite")
    try:
        plain = gpushare_pod(cluster, "plain", "0.1")
        plain["metadata"]["annotations"] = {}
        create(cluster, namespace, [gpushare_pod(cluster, "tolerant", "0.1"), plain])
        pods = {p["metadata"]["name"]: p for p in wait_bound(cluster, namespace, 1)}
        bound = pods["tolerant"]
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in bound[
            "spec"
        ]["tolerations"]
        assert_each_runs_on_its_gpu(cluster, namespace, 1)
        other = json.loads(cluster.kubectl("get", "pod", "plain", "-n", namespace, "-o", "json"))
        assert not other["spec"].get("nodeName"), "the taint should keep a plain pod off"
    finally:
        cluster.kubectl("taint", "node", gpu_node.name, f"{taint}-", check=False)


def test_a_pod_that_fits_no_single_gpu_stays_pending_with_the_reason(
    cluster: LocalCluster, controller: ControllerProcess, gpu_node: GpuNode, namespace: str
) -> None:
    # Two 60% pods take one GPU each (60 + 60 > 100), leaving 40% free on each.
    create(
        cluster,
        namespace,
        [gpushare_pod(cluster, "filler-a", "0.6"), gpushare_pod(cluster, "filler-b", "0.6")],
    )
    wait_bound(cluster, namespace, 2)
    free = {g.uuid: 100 for g in gpu_node.gpus}
    for uuid_, keys in assert_no_gpu_oversubscribed(cluster, gpu_node).items():
        for key in keys:
            ns, name = key.split("/")
            pod = json.loads(cluster.kubectl("get", "pod", "-n", ns, name, "-o", "json"))
            ann = pod["metadata"]["annotations"]
            free[uuid_] -= min(parse_fraction(ann.get(ANN_FRACTION, "1"), field=ANN_FRACTION), 100)
    want = max(free.values()) + 1
    assert want <= 100 and sum(free.values()) >= want, f"cluster too busy for this test: {free}"
    create(cluster, namespace, [gpushare_pod(cluster, "too-big", f"{want}%")])
    message = scheduling_failure(cluster, namespace, "too-big")
    assert f"needs {want} percent compute" in message, message
    assert "MISSING" not in message
    pod = json.loads(cluster.kubectl("get", "pod", "-n", namespace, "too-big", "-o", "json"))
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")


def _requests_total(
    cluster: LocalCluster, controller: ControllerProcess, verb: str, outcome: str
) -> float:
    """gpushare_extender_requests_total{verb, outcome} from the controller's /metrics, read with
    a token allowed to get it, as Prometheus reads it."""
    request = urllib.request.Request(
        f"{controller.extender_url}/metrics",
        headers={"Authorization": f"Bearer {scraper_token(cluster)}"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if (
            line.startswith("gpushare_extender_requests_total{")
            and f'verb="{verb}"' in line
            and f'outcome="{outcome}"' in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_higher_priority_pod_preempts_a_pod_whose_gpu_it_then_fits(
    cluster: LocalCluster, controller: ControllerProcess, gpu_node: GpuNode, namespace: str
) -> None:
    """kube-scheduler counts the node's gpushare.io/gpu-percent itself (the scheduler config
    hack/ writes, as the chart does): with a 60% pod of low priority on each GPU, a 90% pod of
    higher priority fits nowhere (80% free in total). kube-scheduler picks one 60% pod to evict,
    asks the extender's preempt verb, which keeps it because that GPU then has room (unit tests:
    the victims it refuses), evicts it, and the 90% pod runs on that GPU; the other low pod
    keeps running (docs/scheduling.md, "preempt")."""
    assert len(gpu_node.gpus) == 2, gpu_node
    assert not assert_no_gpu_oversubscribed(cluster, gpu_node), "GPUs not empty at the start"
    classes = {f"{namespace}-low": 100, f"{namespace}-high": 1000}
    for name, value in classes.items():
        doc = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        cluster.kubectl("create", "-f", "-", input=json.dumps(doc))
    try:
        low = f"{namespace}-low"
        create(
            cluster,
            namespace,
            [
                gpushare_pod(cluster, "low-a", "0.6", priorityClassName=low),
                gpushare_pod(cluster, "low-b", "0.6", priorityClassName=low),
            ],
        )
        bound = wait_bound(cluster, namespace, 2)
        gpus = {p["metadata"]["annotations"][ANN_GPU_UUID] for p in bound}
        assert len(gpus) == 2, "60% + 60% must take one GPU each"
        before = _requests_total(cluster, controller, "preempt", "ok")
        high = gpushare_pod(cluster, "high", "0.9", priorityClassName=f"{namespace}-high")
        create(cluster, namespace, [high])

        def placed() -> list[Pod] | None:
            pods = {p["metadata"]["name"]: p for p in list_pods(cluster, "-n", namespace)}
            top = pods.get("high")
            if top is None or ANN_GPU_UUID not in top["metadata"].get("annotations", {}):
                return None
            return list(pods.values())

        deadline = time.monotonic() + 120
        pods = placed()
        while pods is None and time.monotonic() < deadline:
            time.sleep(1)
            pods = placed()
        assert pods is not None, (
            f"the 90% pod was not placed: {list_pods(cluster, '-n', namespace)}"
        )
        names = {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}
        assert "high" in names and len(names & {"low-a", "low-b"}) == 1, names
        assert _requests_total(cluster, controller, "preempt", "ok") > before, (
            "the preempt verb was not asked"
        )
        assert_no_gpu_oversubscribed(cluster, gpu_node)
    finally:
        for name in classes:
            cluster.kubectl("delete", "priorityclass", name, "--ignore-not-found", check=False)


@pytest.mark.parametrize(
    "case",
    [
        ({"fraction": "1.5"}, "gpushare.io/gpu-fraction: '1.5' is above 1 but not a whole number"),
        ({"fraction": "0.5", "memory": "200Gi"}, "gpushare.io/gpu-memory: asks for 200Gi"),
        ({"env": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"}, "remove CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
        ({"env": "CUDA_VISIBLE_DEVICES"}, "remove CUDA_VISIBLE_DEVICES"),
        ({"nvidia": "1"}, "remove nvidia.com/gpu"),
        ({"class": "realtime"}, "gpushare.io/class: unknown class 'realtime'"),
    ],
)
def test_the_webhook_refuses_invalid_pods_with_the_field_and_fix(
    cluster: LocalCluster,
    controller: ControllerProcess,
    gpu_node: GpuNode,
    refusing_namespace: str,
    case: tuple[dict[str, str], str],
) -> None:
    overrides, expected = case
    namespace = refusing_namespace
    pod = gpushare_pod(
        cluster, "bad", overrides.get("fraction", "0.5"), memory=overrides.get("memory")
    )
    container = pod["spec"]["containers"][0]
    if "env" in overrides:
        container["env"] = [{"name": overrides["env"], "value": "1"}]
    if "nvidia" in overrides:
        container["resources"]["limits"] = {"nvidia.com/gpu": overrides["nvidia"]}
    if "class" in overrides:
        pod["metadata"]["annotations"]["gpushare.io/class"] = overrides["class"]
    out = subprocess.run(
        ["kubectl", "create", "-n", namespace, "-f", "-"],
        input=json.dumps(pod),
        capture_output=True,
        text=True,
        env=cluster.env,
        check=False,
    )
    if out.returncode == 0:  # leave the namespace as the next case expects it
        cluster.kubectl("delete", "pod", "bad", "-n", namespace, "--wait=false", check=False)
    assert out.returncode != 0, "the API server accepted an invalid gpushare pod"
    assert "denied the request: gpushare:" in out.stderr
    assert expected in out.stderr, out.stderr


def _binds(controller: ControllerProcess) -> int:
    """Binds the controller logged (``bound`` records) so far."""
    return sum(1 for r in controller.log_records() if r.get("msg") == "bound")


def _release(cluster: LocalCluster, namespace: str, burst: list[Pod]) -> None:
    """Remove the scheduling gate of each pod of ``burst``, one after the other."""
    for pod in burst:
        cluster.kubectl(
            "patch", "pod", pod["metadata"]["name"], "-n", namespace, "--type", "json",
            "-p", '[{"op": "remove", "path": "/spec/schedulingGates"}]',
        )  # fmt: skip


def test_killing_the_controller_mid_burst_loses_and_double_books_nothing(
    cluster: LocalCluster, controller: ControllerProcess, gpu_node: GpuNode, namespace: str
) -> None:
    # The burst is created held back (a scheduling gate) and released pod by pod behind the
    # test's back; the controller is killed at its fifth bind, read from its log (a kubectl
    # poll was slower than the binds: the whole burst could be bound before it looked).
    burst = mixed_pods(cluster, 40, "burst")
    for pod in burst:
        pod["spec"]["schedulingGates"] = [{"name": "gpushare.io/test-burst"}]
    create(cluster, namespace, burst)
    binds_before = _binds(controller)
    releasing = threading.Thread(target=_release, args=(cluster, namespace, burst), daemon=True)
    releasing.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _binds(controller) - binds_before < 5:
        time.sleep(0.02)
    controller.kill()
    releasing.join(timeout=120)
    bound = [p for p in list_pods(cluster, "-n", namespace) if p["spec"].get("nodeName")]
    try:
        assert len(bound) >= 5, "the burst did not start binding; nothing was tested"
        assert len(bound) < 40, "burst finished before the kill; nothing was tested"
        assert_no_gpu_oversubscribed(cluster, gpu_node)
        # While it is down, pods gpushare does not own are admitted as usual ...
        plain = gpushare_pod(cluster, "plain", "0.5")
        del plain["metadata"]["annotations"]
        cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(plain))
        # ... and gpushare pods are refused rather than admitted unchecked.
        out = subprocess.run(
            ["kubectl", "create", "-n", namespace, "-f", "-"],
            input=json.dumps(gpushare_pod(cluster, "during-outage", "0.1")),
            capture_output=True,
            text=True,
            env=cluster.env,
            check=False,
        )
        assert out.returncode != 0 and "gpushare" in out.stderr
    finally:
        controller.start()
    pods = wait_bound(cluster, namespace, 40)
    assert_no_gpu_oversubscribed(cluster, gpu_node)
    ours = [p for p in pods if p["metadata"]["name"].startswith("burst-")]
    assert len(ours) == 40
    assert all(parse_placement(p["metadata"]["annotations"]) is not None for p in ours)
    assert_each_runs_on_its_gpu(cluster, namespace, 40)


def test_a_pod_refused_while_a_lost_bind_held_the_gpus_is_placed_when_the_hold_lapses(
    cluster: LocalCluster, controller: ControllerProcess, gpu_node: GpuNode, namespace: str
) -> None:
    """A scheduler that filtered pods and died before binding them leaves filter-time holds:
    capacity kube-scheduler cannot see. A pod refused meanwhile sits among its unschedulable
    pods until some cluster event, up to five minutes in a quiet cluster. When the holds lapse
    the controller touches the refused pod so it is tried again at once.

    The filtered pods are real pending pods (filter holds only for pods the watch knows); their
    node selector keeps the live scheduler from binding them, so the filter calls below play
    the part of the scheduler that died."""
    assert not assert_no_gpu_oversubscribed(cluster, gpu_node), "GPUs not empty at the start"
    url = f"{controller.extender_url}/scheduler/filter"
    nowhere = {"nodeSelector": {"gpushare.io/test": "nowhere"}}
    create(
        cluster,
        namespace,
        [gpushare_pod(cluster, f"ghost-{i}", "1", **nowhere) for i in range(len(gpu_node.gpus))],
    )
    for i, _ in enumerate(gpu_node.gpus):
        ghost = json.loads(
            cluster.kubectl("get", "pod", f"ghost-{i}", "-n", namespace, "-o", "json")
        )
        body = json.dumps({"Pod": ghost, "NodeNames": [gpu_node.name]}).encode()
        request = urllib.request.Request(
            url, data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert json.load(resp)["NodeNames"] == [gpu_node.name]  # held, never bound
    held = time.monotonic()
    create(cluster, namespace, [gpushare_pod(cluster, "late", "0.5")])
    refused = scheduling_failure(cluster, namespace, "late")
    assert "gpushare" in refused, f"the held GPUs did not refuse the pod: {refused!r}"
    late_bound = wait_bound(cluster, namespace, 1, timeout=HOLD_SECONDS + 60)
    pods = [p for p in late_bound if p["metadata"]["name"] == "late"] or late_bound
    waited = time.monotonic() - held
    pod = next(p for p in pods if p["metadata"]["name"] == "late")
    assert ANN_REQUEUED_AT in pod["metadata"]["annotations"]
    # Without the touch: kube-scheduler's own retry, five minutes after the refusal.
    assert waited < HOLD_SECONDS + 60, waited


def test_controller_log_is_structured_json(controller: ControllerProcess) -> None:
    records = controller.log_records()
    assert any(r.get("msg") == "extender listening" for r in records)
    assert all({"time", "level", "component", "logger", "msg"} <= set(r) for r in records)
