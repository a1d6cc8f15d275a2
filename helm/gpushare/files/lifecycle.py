"""Uninstall clean-up for the gpushare chart: nothing of gpushare stays on the nodes.

Two entry points, both run from the chart's own image with the standard library only:

``uninstall``   pre-delete hook Job. Deletes the node-agent DaemonSet with foreground
                propagation and waits until it is gone, so every agent's preStop hook runs
                while the release's RBAC still exists.
``node-cleanup`` preStop hook of each node agent. Does nothing on an ordinary restart (rolling
                update, eviction, crash): running pods keep their MPS daemons. When the
                DaemonSet is being deleted (or is gone), it freezes the agent, thaws the
                pods the agent paused, stops the MPS control daemons, removes the MPS
                directories and the plugin sockets (in DRA mode also the claims' CDI specs
                and the plugin's directory: its socket and checkpoint), and removes the
                gpushare annotation and labels from the node; then lets the agent exit.

A node agent stopped because the GPU Operator upgrades the driver or changes the node's MIG
layout (node.pauseForGpuOperator) marks its node not ready for gpushare pods and waits until its
agent has drained the node (gpushare.node.gpu_operator) before it goes.

Settings come from the environment the chart sets: POD_NAMESPACE, DAEMONSET_NAME, NODE_NAME,
MPS_ROOT, PLUGIN_SOCKET, OPPORTUNISTIC_PLUGIN_SOCKET, TIMEOUT_SECONDS, DRAIN_TIMEOUT_SECONDS,
CGROUP_ROOT; in DRA mode CDI_DIR and DRA_PLUGIN_DIR.
"""

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
NODE_ANNOTATIONS = ("gpushare.io/gpus",)
NODE_LABELS = ("gpushare.io/mps-capable", "gpushare.io/simulated")
CDI_SPEC_GLOBS = ("gpushare.io-gpu_claim-*.json", ".gpushare.io-gpu_claim-*.json.tmp")
"""The agent's CDI spec files of prepared claims, and their half-written temporaries (named by
gpushare.node.dra.cdi.CdiDir.path); other vendors' specs in the same directory stay."""
PAUSE_ANNOTATIONS = ("gpushare.io/pause", "gpushare.io/paused")
MPS_CONTROL = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"


def log(msg: str) -> None:
    print(f"gpushare-lifecycle: {msg}", file=sys.stderr, flush=True)


def api(
    method: str, path: str, body: object = None, content_type: str = "application/json"
) -> tuple[int, dict[str, Any]]:
    """One call to the API server with the pod's service account; (status, JSON body)."""
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    ctx = ssl.create_default_context(cafile=str(SA_DIR / "ca.crt"))
    req = urllib.request.Request(
        f"https://{host}:{port}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={
            "Authorization": "Bearer " + (SA_DIR / "token").read_text().strip(),
            "Content-Type": content_type,
            "Accept": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {}


def daemonset_path() -> str:
    ns, name = os.environ["POD_NAMESPACE"], os.environ["DAEMONSET_NAME"]
    return f"/apis/apps/v1/namespaces/{ns}/daemonsets/{name}"


# --- pre-delete hook ------------------------------------------------------------------------


def uninstall() -> int:
    timeout = float(os.environ.get("TIMEOUT_SECONDS", "180"))
    status, _ = api(
        "DELETE",
        daemonset_path(),
        {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"},
    )
    if status == 404:
        log("node-agent DaemonSet already gone")
        return 0
    if status >= 300:
        log(f"could not delete the node-agent DaemonSet (HTTP {status}); nodes keep gpushare state")
        return 0  # never block `helm uninstall`
    log("deleting the node agents; each cleans its node before it exits")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, _ = api("GET", daemonset_path())
        if status == 404:
            log("all node agents are gone")
            return 0
        time.sleep(1)
    log(f"node agents still terminating after {timeout:.0f}s; continuing the uninstall")
    return 0


# --- preStop hook ---------------------------------------------------------------------------


def uninstalling() -> bool:
    """True when the agent's DaemonSet is being deleted or is gone; False on a mere restart."""
    try:
        status, body = api("GET", daemonset_path())
    except OSError as exc:
        log(f"API server unreachable ({exc}); treating this as a restart")
        return False
    if status == 200:
        return bool(body.get("metadata", {}).get("deletionTimestamp"))
    # 404: deleted. 401: our ServiceAccount is gone with the release; 403: its binding is (Argo
    # CD, kubectl delete -f: the release's objects go together, with no pre-delete hook first).
    return status in (401, 403, 404)


def agent_pids() -> list[int]:
    """The node agent's processes in this container (found by cgroup, so hostPID works too)."""
    try:
        mine = Path("/proc/self/cgroup").read_text()
    except OSError:
        return []
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            same = (proc / "cgroup").read_text() == mine
        except OSError:
            continue
        if same and "gpushare-node-agent" in cmdline:
            pids.append(int(proc.name))
    return pids


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def stop_mps(gpu_dir: Path) -> None:
    pipe = gpu_dir / "pipe"
    try:
        pid = int((pipe / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return
    if shutil.which(MPS_CONTROL):
        env = dict(
            os.environ,
            CUDA_MPS_PIPE_DIRECTORY=str(pipe),
            CUDA_MPS_LOG_DIRECTORY=str(gpu_dir / "log"),
        )
        try:
            subprocess.run(
                [MPS_CONTROL], input="quit\n", text=True, env=env, timeout=10, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            log(f"quit to the MPS daemon in {pipe} failed: {exc}")
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            log(f"MPS daemon {pid} of {gpu_dir.name} stopped")
            return
        except PermissionError:
            break
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
        log(f"MPS daemon {pid} of {gpu_dir.name} killed")
    except (ProcessLookupError, PermissionError):
        pass


def remove_dra_files(cdi_dir: str | None, plugin_dir: str | None) -> None:
    """DRA mode: the CDI specs of claims still prepared (their pods outlive the release, but no
    MPS daemon serves them any more) and the kubelet plugin's socket and checkpoint. The
    directories themselves are host mounts of this container and stay."""
    if cdi_dir and os.path.isdir(cdi_dir):
        for pattern in CDI_SPEC_GLOBS:
            for spec in sorted(Path(cdi_dir).glob(pattern)):
                with contextlib.suppress(FileNotFoundError):
                    spec.unlink()
                    log(f"removed {spec}")
    if plugin_dir and os.path.isdir(plugin_dir):
        for entry in sorted(Path(plugin_dir).iterdir()):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
        log(f"emptied {plugin_dir}")


PAUSE_LABELS = {
    "nvidia.com/gpu-driver-upgrade-state": (
        "pod-deletion-required",
        "drain-required",
        "node-maintenance-required",
        "post-maintenance-required",
        "pod-restart-required",
    ),
    "nvidia.com/mig.config.state": ("pending", "rebooting"),
}
PAUSED_DEPLOY_LABELS = ("nvidia.com/gpu.deploy.client", "nvidia.com/gpu.deploy.device-plugin")
PAUSED_VALUES = ("paused-for-mig-change", "paused-for-driver-upgrade")
"""The GPU Operator upgrading the driver or changing the MIG layout (the chart keeps no agent
there meanwhile: node.pauseForGpuOperator); the same as gpushare.api.gpu_operator, which the
agent reads (a test holds the two together)."""
AGENT_READY = "gpushare.io/agent-ready"
DRAIN_MARKER = ".gpu-operator-drain"
"""Written in the MPS root by the agent while it drains: draining, then drained."""


def thaw_paused(pods: list[dict[str, Any]], cgroup_root: Path) -> list[str]:
    """Thaw the containers of the pods the agent paused (``gpushare.io/paused`` or a standing
    ``gpushare.io/pause``): with the release gone nobody withdraws their requests, and a frozen
    pod would wait forever (docs/node-agent.md, "Pausing a pod"). Each container cgroup named
    after a container ID of such a pod is thawed (cgroup v2 ``cgroup.freeze``, v1
    ``freezer.state``); the IDs thawed are returned."""
    ids: set[str] = set()
    for pod in pods:
        annotations = pod.get("metadata", {}).get("annotations") or {}
        if not any(k in annotations for k in PAUSE_ANNOTATIONS):
            continue
        for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
            for cs in pod.get("status", {}).get(key) or []:
                raw = cs.get("containerID") or ""
                if raw:
                    ids.add(raw.split("://", 1)[-1])
    v2 = (cgroup_root / "cgroup.controllers").is_file()
    top = cgroup_root if v2 else cgroup_root / "freezer"
    name, value = ("cgroup.freeze", "0") if v2 else ("freezer.state", "THAWED")
    thawed = []
    for parent in [p for p in (top / "kubepods", top / "kubepods.slice") if p.is_dir()]:
        for dirpath, dirnames, _ in os.walk(parent):
            for d in dirnames:
                cid = next((i for i in ids if i in d), None)
                if cid is not None:
                    with contextlib.suppress(OSError):
                        (Path(dirpath) / d / name).write_text(value)
                        thawed.append(cid)
    return thawed


def paused_for_gpu_operator(node: str) -> bool:
    status, body = api("GET", f"/api/v1/nodes/{node}")
    if status != 200:
        return False
    labels = body.get("metadata", {}).get("labels") or {}
    if any(labels.get(key) in values for key, values in PAUSE_LABELS.items()):
        return True
    values = [labels.get(key) or "" for key in PAUSED_DEPLOY_LABELS]
    return any(paused in value for value in values for paused in PAUSED_VALUES)


def wait_drained() -> None:
    """Keep this container (and its agent, which evicts gpushare's pods and stops the MPS
    daemons) until the agent says drained, at most DRAIN_TIMEOUT_SECONDS: the GPU Operator
    waits for this pod, so it touches the GPUs only after."""
    marker = Path(os.environ.get("MPS_ROOT", "/run/gpushare/node/mps")) / DRAIN_MARKER
    timeout = float(os.environ.get("DRAIN_TIMEOUT_SECONDS", "240"))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if marker.read_text().strip() == "drained":
                log("drained: no gpushare pod or MPS daemon left on this node")
                return
        time.sleep(1)
    log(f"not drained after {timeout:.0f}s; stopping anyway")


def node_cleanup() -> int:
    if not uninstalling():
        node = os.environ.get("NODE_NAME", "")
        if node and paused_for_gpu_operator(node):
            # Stopped for a driver upgrade or a MIG change: nothing is placed here until an agent
            # is back (it publishes itself ready again when it has started on the new driver or
            # layout), and the agent gets to drain the node first.
            patch = {"metadata": {"annotations": {AGENT_READY: "false"}}}
            status, _ = api("PATCH", f"/api/v1/nodes/{node}", patch, "application/merge-patch+json")
            log(f"paused by the GPU Operator: node {node} {AGENT_READY}=false (HTTP {status})")
            wait_drained()
        log("DaemonSet still present: a restart, leaving MPS daemons and directories in place")
        return 0
    log("uninstall: cleaning this node")
    agents = agent_pids()
    # Frozen, the agent cannot restart a daemon or recreate a directory behind our back.
    signal_all(agents, signal.SIGSTOP)
    try:
        node = os.environ.get("NODE_NAME", "")
        status, body = api("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")
        if node and status == 200:
            root = Path(os.environ.get("CGROUP_ROOT", "/host/sys/fs/cgroup"))
            thawed = thaw_paused(body.get("items") or [], root)
            log(f"thawed {len(thawed)} container(s) of paused pods")
        root = Path(os.environ.get("MPS_ROOT", "/run/gpushare/node/mps"))
        if root.is_dir():
            for gpu_dir in sorted(p for p in root.iterdir() if p.is_dir()):
                stop_mps(gpu_dir)
            shutil.rmtree(root, ignore_errors=True)
            log(f"removed {root}")
        for name in ("PLUGIN_SOCKET", "OPPORTUNISTIC_PLUGIN_SOCKET"):
            sock = os.environ.get(name)
            if sock and os.path.lexists(sock):
                os.unlink(sock)
                log(f"removed {sock}")
        remove_dra_files(os.environ.get("CDI_DIR"), os.environ.get("DRA_PLUGIN_DIR"))
        node = os.environ.get("NODE_NAME", "")
        if node:
            patch = {
                "metadata": {
                    "annotations": {k: None for k in NODE_ANNOTATIONS},
                    "labels": {k: None for k in NODE_LABELS},
                }
            }
            status, _ = api("PATCH", f"/api/v1/nodes/{node}", patch, "application/merge-patch+json")
            log(f"node {node}: gpushare annotation and labels removed (HTTP {status})")
    finally:
        # SIGTERM first, so the agent handles it as soon as it runs again and exits.
        signal_all(agents, signal.SIGTERM)
        signal_all(agents, signal.SIGCONT)
    return 0


def main() -> int:
    commands = {"uninstall": uninstall, "node-cleanup": node_cleanup}
    if len(sys.argv) != 2 or sys.argv[1] not in commands:
        log(f"usage: lifecycle.py {'|'.join(commands)}")
        return 2
    return commands[sys.argv[1]]()


if __name__ == "__main__":
    sys.exit(main())
