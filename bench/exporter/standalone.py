"""Standalone exporter: ``python -m bench.exporter.standalone --backend simulated:8xH100-80GB ...``.

For development, tests and benchmarks the exporter runs outside the node agent (no chart or
image runs it, so it lives here, beside the benchmarks that use it, not in the product): pods come
from a file written by ``kubectl get pods -o json`` (re-read when it changes) instead of the
agent's watch. On a simulated backend the runner also plays the agent's part of feeding the
backend: it derives each GPU's load from the pods placed on it and reports the pods' real
host processes (found through their cgroups) as GPU processes with simulated memory, so the
PID -> cgroup -> pod attribution runs for real. All of it is labelled ``simulated="true"``.
"""

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo
from gpushare.api.logs import setup_json_logging
from gpushare.api.names import AGENT_METRICS_PORT
from gpushare.api.pod import pod_info
from gpushare.node.core.allocations import PodAllocation
from gpushare.node.core.cgroups import parse_cgroup
from gpushare.node.exporter import Exporter, MpsDaemonStatus, build_exporter
from gpushare.node.exporter.allocations import allocations_from_pods
from gpushare.node.exporter.podresources import PodResourcesPoller
from gpushare.node.exporter.sampler import SamplerSettings
from gpushare.node.exporter.server import serve
from gpushare.node.gpu.backend import GpuBackend, GpuProcess, GpuSample, HealthEvent
from gpushare.node.gpu.factory import open_backend
from gpushare.node.metrics import registry_for
from gpushare.node.mps.manager import MpsManager
from gpushare.node.simload import Share, simulated_load

log = logging.getLogger("gpushare.node.exporter.standalone")


class PodsFile:
    """Pods as ``kubectl get pods -o json`` wrote them; re-read when the file changes."""

    def __init__(self, path: Path | None, *, node_name: str) -> None:
        self.path = path
        self.node_name = node_name
        self._mtime: float | None = None
        self._lock = threading.Lock()
        self._allocs: list[PodAllocation] = []

    def refresh(self) -> None:
        if self.path is None:
            return
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            return
        if mtime == self._mtime:
            return
        try:
            data: Any = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            log.warning("cannot read pods file %s: %s", self.path, exc)
            return
        items = data.get("items", []) if isinstance(data, dict) else data
        allocs = allocations_from_pods(
            [pod_info(i) for i in items if isinstance(i, dict)], node_name=self.node_name
        )
        with self._lock:
            self._allocs = allocs
        self._mtime = mtime

    def __call__(self) -> list[PodAllocation]:
        with self._lock:
            return list(self._allocs)


class SimulatedPodProcesses:
    """The simulated backend, plus the pods' real host processes reported as GPU processes.

    The simulated backend holds no processes of its own; the runner (standing in for the
    agent) tells it which host PIDs belong to pods placed on each GPU.
    """

    def __init__(self, inner: GpuBackend) -> None:
        if not inner.simulated:
            raise ValueError("pod processes are only simulated on a simulated backend")
        self.inner = inner
        self._lock = threading.Lock()
        self._procs: dict[str, list[GpuProcess]] = {}

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def simulated(self) -> bool:
        return True

    def inventory(self) -> list[GpuInfo]:
        return self.inner.inventory()

    def processes(self, uuid: str) -> list[GpuProcess]:
        self.inner.processes(uuid)  # raises for an unknown GPU, like the real one
        with self._lock:
            return list(self._procs.get(uuid, []))

    def set_processes(self, uuid: str, procs: list[GpuProcess]) -> None:
        with self._lock:
            self._procs[uuid] = procs

    def sample(self, uuid: str) -> GpuSample:
        return self.inner.sample(uuid)

    def wait_health_events(self, timeout_s: float) -> list[HealthEvent]:
        return self.inner.wait_health_events(timeout_s)

    def close(self) -> None:
        self.inner.close()


def pod_pids(*, proc_root: Path, pods: Sequence[PodAllocation]) -> dict[str, list[int]]:
    """Host PIDs of the pods' app containers (not the sandbox), by pod UID, found through
    /proc/<pid>/cgroup."""
    containers = {a.uid: set(a.containers) for a in pods if a.uid}
    found: dict[str, list[int]] = defaultdict(list)
    if not containers:
        return found
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            owner = parse_cgroup((entry / "cgroup").read_text())
        except OSError:
            continue
        if owner is not None and owner.container_id in containers.get(owner.pod_uid, ()):
            found[owner.pod_uid].append(int(entry.name))
    for pids in found.values():
        pids.sort()
    return found


def simulated_memory(alloc: PodAllocation, gpu: GpuInfo) -> int:
    """The pod's simulated footprint, by the agent's formula (gpushare.node.simload)."""
    load = simulated_load(gpu, [Share(alloc.thread_percent, alloc.memory_limit_bytes)])
    return load.memory_used_bytes


def feed_simulation(
    backend: GpuBackend,
    allocs: Sequence[PodAllocation],
    *,
    proc_root: Path,
    processes: SimulatedPodProcesses | None,
) -> None:
    """Set each simulated GPU's load from its placements, as the agent does on a node."""
    inner = processes.inner if processes is not None else backend
    set_load = getattr(inner, "set_load", None)
    by_gpu: dict[str, list[PodAllocation]] = defaultdict(list)
    for a in allocs:
        for uuid in a.gpu_uuids:
            by_gpu[uuid].append(a)
    pids = pod_pids(proc_root=proc_root, pods=allocs) if processes is not None else {}
    for gpu in backend.inventory():
        placed = by_gpu.get(gpu.uuid, [])
        load = simulated_load(gpu, [Share(a.thread_percent, a.memory_limit_bytes) for a in placed])
        if set_load is not None:
            set_load(
                gpu.uuid,
                pipes=load.pipes,
                sm_occupancy=load.sm_occupancy,
                memory_used_bytes=load.memory_used_bytes,
            )
        if processes is not None:
            procs = [
                GpuProcess(
                    pid=pids[a.uid][0],
                    used_memory_bytes=simulated_memory(a, gpu),
                    mps_client=True,
                )
                for a in placed
                if pids.get(a.uid)
            ]
            processes.set_processes(gpu.uuid, procs)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.exporter.standalone",
        description="Run the gpushare node exporter on its own (development, tests, benchmarks).",
    )
    parser.add_argument(
        "--backend",
        required=True,
        help='"nvml" on a GPU node, or "simulated:<count>x<model>", e.g. simulated:8xH100-80GB',
    )
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME", socket.gethostname()))
    parser.add_argument("--address", default="127.0.0.1", help="listen address (127.0.0.1)")
    parser.add_argument(
        "--port",
        type=int,
        default=AGENT_METRICS_PORT,
        help=f"listen port; 0 picks one ({AGENT_METRICS_PORT})",
    )
    parser.add_argument(
        "--pods-file",
        type=Path,
        help="JSON from `kubectl get pods -A -o json`; re-read when it changes",
    )
    parser.add_argument("--sample-interval", type=float, default=1.0, help="seconds, >= 0.1")
    parser.add_argument("--history", type=float, default=600.0, help="profiler history, seconds")
    parser.add_argument("--proc-root", type=Path, default=Path("/proc"), help="the host's /proc")
    parser.add_argument(
        "--pod-resources-socket",
        type=Path,
        help="kubelet PodResources socket, for owners of processes in pods not in --pods-file",
    )
    parser.add_argument(
        "--mps-root",
        type=Path,
        help="simulated backends only: directory for the simulated MPS daemons' dirs",
    )
    parser.add_argument(
        "--port-file", type=Path, help="write the bound port here once serving (for tests)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    setup_json_logging(component="gpushare-exporter")
    args = _parse_args(argv)
    try:
        settings = SamplerSettings(
            interval_s=args.sample_interval, history_s=args.history, proc_root=args.proc_root
        )
        opened = open_backend(args.backend, node_name=args.node_name)
    except InvalidInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    processes = SimulatedPodProcesses(opened) if opened.simulated else None
    backend: GpuBackend = processes if processes is not None else opened
    pods = PodsFile(args.pods_file, node_name=args.node_name)
    poller = (
        PodResourcesPoller(socket_path=args.pod_resources_socket)
        if args.pod_resources_socket
        else None
    )
    mps_status = None
    if opened.simulated and args.mps_root is not None:
        # The agent's MPS manager in simulated mode: no daemon, only its directories.
        manager = MpsManager(root=args.mps_root, simulated=True)
        manager.ensure(g.uuid for g in backend.inventory())

        def mps_status() -> dict[str, MpsDaemonStatus]:
            return {u: MpsDaemonStatus(up=s.up) for u, s in manager.status().items()}

    exporter: Exporter = build_exporter(
        backend=backend,
        node_name=args.node_name,
        placements=pods,
        mps_status=mps_status,
        pod_resources=poller,
        settings=settings,
    )
    stop = threading.Event()

    def feed() -> None:
        while not stop.is_set():
            pods.refresh()
            if opened.simulated:
                feed_simulation(backend, pods(), proc_root=args.proc_root, processes=processes)
            stop.wait(2.0)

    def health() -> None:
        while not stop.is_set():
            for event in backend.wait_health_events(1.0):
                exporter.health.record(event)

    pods.refresh()
    if opened.simulated:
        feed_simulation(backend, pods(), proc_root=args.proc_root, processes=processes)
    registry = registry_for("exporter", simulated=opened.simulated)
    for collector in exporter.collectors():
        registry.register(collector)
    exporter.start()
    if poller is not None:
        poller.start()
    threading.Thread(target=feed, name="gpushare-pods-feed", daemon=True).start()
    threading.Thread(target=health, name="gpushare-health", daemon=True).start()
    server = serve(registry=registry, profiler=exporter.profiler, host=args.address, port=args.port)
    port = server.port
    log.info("serving /metrics and /profile on http://%s:%d", args.address, port)
    if args.port_file:
        args.port_file.write_text(f"{port}\n")
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.stop()
        exporter.stop()
        if poller is not None:
            poller.stop()
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
