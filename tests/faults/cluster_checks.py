"""What the fault tests check after every fault, read from the real cluster: the invariants of
record (placements vs node inventory), the kubelet's own device assignments, each pod's fate
(Running with the environment its placement promises, or Pending with a reason), and the
helpers that kill and restart components and wait for the shared cluster to be quiet.
"""

import itertools
import json
import os
import signal
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo, load_inventory
from gpushare.api.names import (
    ANN_FRACTION,
    ANN_MEMORY,
    ANN_NODE_GPUS,
    RESOURCE_GPU_PERCENT,
    SCHEDULER_NAME,
    SLICES_PER_GPU,
)
from gpushare.api.placement import Placement, parse_placement
from gpushare.api.quantities import parse_fraction, parse_memory
from gpushare.node.mps.client import pinned_memory_limit
from tests.fixtures.node_agent import DEVICE_PLUGIN_DIR

Pod = dict[str, Any]
CHECKPOINT = DEVICE_PLUGIN_DIR / "kubelet_internal_checkpoint"
ENV_MARK = "---"


def kubectl_json(cluster: Any, *args: str) -> Any:
    return json.loads(cluster.kubectl(*args, "-o", "json"))


def pod_key(pod: Mapping[str, Any]) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


# ---- the invariants of record --------------------------------------------------------------


def inventory(cluster: Any) -> list[GpuInfo]:
    node = kubectl_json(cluster, "get", "node", cluster.node_name)
    text = node["metadata"].get("annotations", {}).get(ANN_NODE_GPUS)
    return load_inventory(text) if text else []


def share_of(pod: Mapping[str, Any]) -> int:
    ann = pod["metadata"].get("annotations") or {}
    if ANN_FRACTION in ann:
        return min(parse_fraction(ann[ANN_FRACTION], field=ANN_FRACTION), SLICES_PER_GPU)
    for container in pod["spec"].get("containers", []):
        value = (container.get("resources", {}).get("limits") or {}).get(RESOURCE_GPU_PERCENT)
        if value is not None:
            return min(int(value), SLICES_PER_GPU)
    return SLICES_PER_GPU


def invariant_violations(all_pods: Iterable[Pod], gpus: list[GpuInfo], node_name: str) -> list[str]:
    """Over every live pod of the cluster: guaranteed shares <= 100% and memory limits <= the
    GPU's memory on every GPU; each placed pod names GPUs of the node it is bound to."""
    by_gpu = {g.uuid: g for g in gpus}
    percent: dict[str, int] = defaultdict(int)
    memory: dict[str, int] = defaultdict(int)
    tenants: dict[str, list[str]] = defaultdict(list)
    problems: list[str] = []
    for pod in all_pods:
        if pod["status"].get("phase") in ("Succeeded", "Failed"):
            continue
        try:
            placement = parse_placement(pod["metadata"].get("annotations") or {})
        except InvalidInputError as exc:
            problems.append(f"{pod_key(pod)}: unreadable placement ({exc})")
            continue
        if placement is None:
            continue
        bound = pod["spec"].get("nodeName")
        for uuid in placement.gpu_uuids:
            if uuid not in by_gpu:
                problems.append(f"{pod_key(pod)} names GPU {uuid}, not on node {node_name}")
                continue
            if bound and bound != node_name:
                problems.append(f"{pod_key(pod)} bound to {bound} but placed on {uuid}")
            percent[uuid] += share_of(pod)
            memory[uuid] += placement.memory_limit_bytes
            tenants[uuid].append(pod_key(pod))
    for uuid, total in percent.items():
        if total > SLICES_PER_GPU:
            problems.append(f"GPU {uuid} oversubscribed: {total}% ({len(tenants[uuid])} pods)")
        if memory[uuid] > by_gpu[uuid].memory_bytes:
            problems.append(f"GPU {uuid} memory oversubscribed: {memory[uuid]} bytes")
    return problems


def checkpoint_duplicates(live_uids: set[str]) -> list[str]:
    """Device IDs of gpushare.io/gpu-percent the kubelet assigned to more than one live
    container (read from its own checkpoint file)."""
    try:
        data = json.loads(CHECKPOINT.read_text())
    except (OSError, ValueError):
        return []
    owners: dict[str, list[str]] = defaultdict(list)
    for entry in (data.get("Data") or {}).get("PodDeviceEntries") or []:
        if (
            entry.get("ResourceName") != RESOURCE_GPU_PERCENT
            or entry.get("PodUID") not in live_uids
        ):
            continue
        ids = entry.get("DeviceIDs") or {}
        flat = [d for part in ids.values() for d in part] if isinstance(ids, dict) else list(ids)
        for device in flat:
            owners[device].append(f"{entry['PodUID']}/{entry.get('ContainerName')}")
    return [f"device {d} given to {', '.join(o)}" for d, o in owners.items() if len(o) > 1]


# ---- each pod's fate -----------------------------------------------------------------------


def expected_env(placement: Placement) -> dict[str, str]:
    """What Allocate must have put in a fractional pod's container for its placement."""
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(placement.gpu_uuids),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(placement.thread_percent),
    }
    if placement.memory_limit_bytes > 0:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = pinned_memory_limit(placement.memory_limit_bytes)
    return env


def logged_env(text: str) -> dict[str, str] | None:
    if ENV_MARK not in text:
        return None
    head = text.split(ENV_MARK, 1)[0]
    return dict(line.split("=", 1) for line in head.splitlines() if "=" in line)


@dataclass
class Fate:
    running: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    unsettled: dict[str, str] = field(default_factory=dict)
    """Pods on their way (bound but not running yet, pending with no reason yet)."""
    violations: list[str] = field(default_factory=list)
    """Pods lost: failed, running with a wrong environment."""
    failed_to_start: list[str] = field(default_factory=list)
    """Pods Failed only because the runtime's container start failed (``StartError``): a kubelet
    killed mid-start leaves such a ``restartPolicy: Never`` pod Failed, with that reason on its
    container. Reported apart; only the kubelet fault may cause them."""
    rejected_at_admission: dict[str, float | None] = field(default_factory=dict)
    """Pods the kubelet failed at admission (``UnexpectedAdmissionError``, no container ever
    started), each with when it was bound (epoch seconds, :func:`bound_at`; None when
    unknown). Reported apart: only a node agent killed while the kubelet was
    admitting them may cause them (the kubelet does not retry a failed Allocate)."""


class FateReader:
    """Classifies the pods of one namespace; caches each running pod's checked environment."""

    def __init__(self, cluster: Any, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self._env_ok: dict[str, str | None] = {}

    def _env_problem(self, pod: Pod) -> str | None:
        uid = pod["metadata"]["uid"]
        if uid in self._env_ok:
            return self._env_ok[uid]
        name = pod["metadata"]["name"]
        text = self.cluster.kubectl("logs", name, "-n", self.namespace, check=False)
        env = logged_env(text)
        if env is None:
            return "no environment logged yet"
        placement = parse_placement(pod["metadata"].get("annotations") or {})
        if placement is None:
            problem: str | None = "running without a placement"
        else:
            wrong = {
                k: (env.get(k), v) for k, v in expected_env(placement).items() if env.get(k) != v
            }
            problem = f"environment differs from placement: {wrong}" if wrong else None
        self._env_ok[uid] = problem
        return problem

    def read(self, pods: list[Pod], events: list[dict[str, Any]]) -> Fate:
        reasons: dict[str, list[str]] = defaultdict(list)
        for event in events:
            obj = event.get("involvedObject") or {}
            if event.get("reason") == "FailedScheduling" and obj.get("kind") == "Pod":
                reasons[str(obj.get("uid") or obj.get("name"))].append(str(event.get("message")))
                reasons[str(obj.get("name"))].append(str(event.get("message")))
        fate = Fate()
        running = [
            p
            for p in pods
            if p["status"].get("phase") == "Running"
            and all(c.get("ready") for c in p["status"].get("containerStatuses") or [{}])
        ]
        with ThreadPoolExecutor(max_workers=4) as pool:
            problems = dict(
                zip(
                    (p["metadata"]["uid"] for p in running),
                    pool.map(self._env_problem, running),
                    strict=True,
                )
            )
        for pod in pods:
            key, uid = pod_key(pod), pod["metadata"]["uid"]
            phase = pod["status"].get("phase")
            if phase in ("Failed", "Succeeded"):
                ended = [
                    f"{c.get('name')}: {term.get('reason')} exit {term.get('exitCode')}"
                    for c in pod["status"].get("containerStatuses") or []
                    if (term := (c.get("state") or {}).get("terminated"))
                ]
                text = (
                    f"{key}: {phase} ({pod['status'].get('reason')}: "
                    f"{pod['status'].get('message')}; containers {ended})"
                )
                start_error = (
                    phase == "Failed" and ended and all(": StartError exit" in e for e in ended)
                )
                if start_error:
                    fate.failed_to_start.append(text)
                elif rejected_at_admission(pod):
                    fate.rejected_at_admission[text] = bound_at(pod)
                else:
                    fate.violations.append(text)
            elif uid in problems:
                problem = problems[uid]
                if problem is None:
                    fate.running.append(key)
                elif problem.startswith("no environment"):
                    fate.unsettled[key] = problem
                else:
                    fate.violations.append(f"{key}: {problem}")
            elif pod["spec"].get("nodeName"):
                waiting = [
                    (c.get("state") or {}).get("waiting", {}).get("reason", "")
                    for c in pod["status"].get("containerStatuses") or []
                ]
                fate.unsettled[key] = f"bound, not running yet {waiting}"
            elif reasons.get(uid) or reasons.get(pod["metadata"]["name"]):
                fate.pending.append(key)
            else:
                fate.unsettled[key] = "pending without a scheduling event yet"
        return fate


def rejected_at_admission(pod: Pod) -> bool:
    """The kubelet failed the pod before starting any container (its admission refused it)."""
    status = pod["status"]
    return (
        status.get("phase") == "Failed"
        and status.get("reason") == "UnexpectedAdmissionError"
        and not any(
            (c.get("state") or {}).get("terminated") for c in status.get("containerStatuses") or []
        )
    )


def bound_at(pod: Pod) -> float | None:
    """When the pod was bound, in epoch seconds: the placement's bind time the extender wrote
    just before the Binding, else its PodScheduled condition (whole seconds; a pod the kubelet
    rejects at admission may have lost its conditions)."""
    try:
        placement = parse_placement(pod["metadata"].get("annotations") or {})
    except InvalidInputError:
        placement = None
    if placement is not None:
        return placement.bind_time.timestamp()
    for condition in pod["status"].get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            stamp = condition.get("lastTransitionTime")
            if stamp:
                return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return None


# ---- pods of a burst -----------------------------------------------------------------------

SIZES = (5, 10, 15, 20)
"""Percent per pod, cycling: 24 pods ask for 3 GPUs of the node's 2, so a third must wait."""


def burst_pods(image: str, count: int, prefix: str) -> list[Pod]:
    pods = []
    for i in range(count):
        annotations = {ANN_FRACTION: f"{SIZES[i % len(SIZES)]}%"}
        if i % 3 == 2:
            annotations[ANN_MEMORY] = "8Gi"
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"{prefix}-{i:03d}", "annotations": annotations},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": image,
                            "imagePullPolicy": "Never",
                            "command": [
                                "sh",
                                "-c",
                                f"env | grep -E '^(CUDA|NVIDIA)_' | sort; echo {ENV_MARK}; "
                                "exec sleep 3600",
                            ],
                            "resources": {"requests": {"cpu": "1m", "memory": "4Mi"}},
                        }
                    ],
                },
            }
        )
    return pods


def fits_somewhere(pod: Pod, gpus: list[GpuInfo], all_pods: Iterable[Pod]) -> str | None:
    """A GPU the pending pod would fit on now (a sign the scheduler has not caught up). A GPU
    holding pods of another namespace does not count: gpushare's default tenancy boundary
    keeps it from being shared across namespaces (docs/security.md)."""
    used: dict[str, int] = defaultdict(int)
    memory: dict[str, int] = defaultdict(int)
    foreign: set[str] = set()
    namespace = pod["metadata"].get("namespace")
    for other in all_pods:
        if other["status"].get("phase") in ("Succeeded", "Failed"):
            continue
        placement = parse_placement(other["metadata"].get("annotations") or {})
        if placement is None:
            continue
        for uuid in placement.gpu_uuids:
            used[uuid] += share_of(other)
            memory[uuid] += placement.memory_limit_bytes
            if other["metadata"].get("namespace") != namespace:
                foreign.add(uuid)
    want = share_of(pod)
    ann = pod["metadata"].get("annotations") or {}
    want_memory = parse_memory(ann[ANN_MEMORY], field=ANN_MEMORY) if ANN_MEMORY in ann else 0
    for gpu in gpus:
        if not gpu.healthy or gpu.uuid in foreign:
            continue
        need = want_memory or gpu.memory_bytes * want // SLICES_PER_GPU
        if used[gpu.uuid] + want <= SLICES_PER_GPU and memory[gpu.uuid] + need <= gpu.memory_bytes:
            return gpu.uuid
    return None


# ---- a quiet cluster, and components ------------------------------------------------------


def _ancestors() -> set[int]:
    """This process and every process above it (the make or CI shell that started it)."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        # The command name in parentheses may hold spaces; the parent PID follows it.
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return pids


def _runs_pytest(argv: list[str]) -> bool:
    """A pytest process itself: `pytest ...`, `python -m pytest ...`, not a shell whose
    script text merely mentions pytest."""
    head = [Path(a).name for a in argv[:3]]
    if any(h in ("pytest", "py.test") for h in head):
        return True
    return any(a == "-m" and b == "pytest" for a, b in itertools.pairwise(argv[:4]))


def other_pytests() -> list[str]:
    """Other pytest processes on this host (teammates' runs on the shared cluster)."""
    mine = _ancestors()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            argv = [
                a.decode(errors="replace")
                for a in (entry / "cmdline").read_bytes().split(b"\0")
                if a
            ]
        except OSError:
            continue
        if _runs_pytest(argv):
            found.append(f"{entry.name}: {' '.join(argv)[:120]}")
    return found


def wait_quiet(*, timeout_s: float) -> None:
    """Destructive faults break teammates' tests: wait until no other pytest runs."""
    deadline = time.monotonic() + timeout_s
    while (others := other_pytests()) and time.monotonic() < deadline:
        time.sleep(5)
    if others:
        pytest.skip(f"other test runs use the shared cluster; not killing components: {others}")


def wait_until(check: Callable[[], Any], *, timeout_s: float, every_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every_s)
    return None


def sigkill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    wait_until(
        lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), timeout_s=10, every_s=0.05
    )


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def harness(cluster: Any, *args: str) -> None:
    cluster.harness(*args)


def scheduler_is(name: str) -> str:
    return SCHEDULER_NAME if name == "gpushare-scheduler" else name


def apiserver_ready(cluster: Any) -> bool:
    proc = subprocess.run(
        ["kubectl", "get", "--raw", "/readyz"],
        capture_output=True,
        text=True,
        env=cluster.env,
        timeout=10,
        check=False,
    )
    return proc.returncode == 0


CHUNK = 8


@dataclass
class Burst:
    """Creates the pods in chunks from a thread, retrying what the cluster refuses meanwhile
    (the webhook or the API server down), as a workload controller would."""

    cluster: Any
    namespace: str
    pods: list[Pod]
    created: int = 0
    refused: int = 0
    errors: list[str] = field(default_factory=list)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 300
        for start in range(0, len(self.pods), CHUNK):
            chunk = self.pods[start : start + CHUNK]
            while time.monotonic() < deadline:
                doc = {"apiVersion": "v1", "kind": "List", "items": chunk}
                self.cluster.kubectl(
                    "apply", "-n", self.namespace, "-f", "-", input=json.dumps(doc), check=False
                )
                if self._exist({p["metadata"]["name"] for p in chunk}):
                    break
                self.refused += 1
                time.sleep(0.5)
            self.created = start + len(chunk)
            time.sleep(0.3)

    def _exist(self, names: set[str]) -> bool:
        out = self.cluster.kubectl(
            "get", "pods", "-n", self.namespace, "-o", "name", check=False
        ).split()
        return names <= {n.removeprefix("pod/") for n in out}

    def join(self) -> None:
        assert self.thread is not None
        self.thread.join(timeout=320)


def settle(
    cluster: Any, namespace: str, gpus: list[GpuInfo], expected: int, timeout_s: float
) -> tuple[float | None, dict[str, Any]]:
    """Poll until every pod of the burst is settled and every invariant holds; (seconds, last
    state)."""
    reader = FateReader(cluster, namespace)
    start = time.monotonic()
    state: dict[str, Any] = {}
    while time.monotonic() - start < timeout_s:
        try:
            everyone = kubectl_json(cluster, "get", "pods", "-A")["items"]
            events = kubectl_json(cluster, "get", "events", "-n", namespace)["items"]
        except AssertionError as exc:  # the API server is still coming back
            state = {"api": str(exc)[:200]}
            time.sleep(1)
            continue
        ours = [p for p in everyone if p["metadata"]["namespace"] == namespace]
        fate = reader.read(ours, events)
        live = {
            p["metadata"]["uid"]
            for p in everyone
            if p["status"].get("phase") not in ("Succeeded", "Failed")
        }
        invariants = invariant_violations(everyone, gpus, cluster.node_name)
        duplicates = checkpoint_duplicates(live)
        waiting_with_room = [
            f"{p['metadata']['name']} fits on {gpu}"
            for p in ours
            if not p["spec"].get("nodeName")
            and (gpu := fits_somewhere(p, gpus, everyone)) is not None
        ]
        state = {
            "pods": len(ours),
            "running": len(fate.running),
            "pending_with_reason": len(fate.pending),
            "unsettled": dict(list(fate.unsettled.items())[:5]),
            "lost": fate.violations,
            "failed_to_start": fate.failed_to_start,
            "rejected_at_admission": fate.rejected_at_admission,
            "invariants": invariants + duplicates,
            "pending_with_room": waiting_with_room[:5],
        }
        if invariants or duplicates or fate.violations:
            # A violation is final: report it, do not wait it away; but say whether it was
            # still there 3 s later (a permanent miscount, or the moment between two patches).
            time.sleep(3)
            later = invariant_violations(
                kubectl_json(cluster, "get", "pods", "-A")["items"], gpus, cluster.node_name
            )
            state["invariants"] = [
                f"{v} ({'still there' if v in later else 'gone'} 3 s later)" for v in invariants
            ] + duplicates
            return None, state
        if len(ours) == expected and not fate.unsettled and not waiting_with_room:
            return time.monotonic() - start, state
        time.sleep(1.0)
    return None, state
