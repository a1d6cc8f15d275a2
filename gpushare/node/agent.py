"""The node agent: ties the GPU backend, MPS daemons, device plugin, node publishing and
metrics together and runs them until stopped.

Start order matters: MPS daemons are adopted or started first, the node inventory is
published, and only then is the device plugin served and registered, so the kubelet never
advertises a GPU whose daemon is not there (it is advertised Unhealthy instead).
"""

import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo, dump_inventory
from gpushare.api.names import (
    AGENT_METRICS_PORT,
    ANN_AGENT_MODE,
    ANN_AGENT_READY,
    ANN_NODE_GPUS,
    LABEL_MPS_CAPABLE,
    LABEL_SIMULATED,
    RESOURCE_GPU_OPPORTUNISTIC,
    RESOURCE_GPU_PERCENT,
    STATE_ALLOCATED,
)
from gpushare.api.placement import parse_placement
from gpushare.node.coexistence import HEALTH_SOURCE as OTHER_PLUGIN
from gpushare.node.deviceplugin.allocator import Allocator
from gpushare.node.deviceplugin.devices import opportunistic_slice_ids, slice_ids
from gpushare.node.deviceplugin.health import DeviceHealth
from gpushare.node.deviceplugin.holdings import (
    STATE_DIR,
    STATE_FILE,
    AnswerBook,
    kubelet_held,
    kubelet_identity,
)
from gpushare.node.deviceplugin.plugin import (
    DEFAULT_ENDPOINT,
    KUBELET_SOCKET,
    OPPORTUNISTIC_ENDPOINT,
    PluginRunner,
)
from gpushare.node.deviceplugin.pods import PodSource, pod_info
from gpushare.node.deviceplugin.response import DeviceNode
from gpushare.node.deviceplugin.server import DevicePluginServicer
from gpushare.node.dra.allocations import claim_allocations
from gpushare.node.dra.cdi import DEFAULT_CDI_DIR, CdiDir
from gpushare.node.dra.checkpoint import CHECKPOINT_FILE, Checkpoint
from gpushare.node.dra.driver import DraDriver
from gpushare.node.dra.plugin import DEFAULT_KUBELET_ROOT, DraPluginRunner, plugin_dir
from gpushare.node.dra.server import DraPluginV1, DraPluginV1beta1
from gpushare.node.dra.slices import SlicePublisher
from gpushare.node.exporter.allocations import PodAllocation
from gpushare.node.exporter.attribution import pods_with_running_containers
from gpushare.node.extension import ExporterHandle, wire_exporter
from gpushare.node.faults.monitor import FaultMonitor
from gpushare.node.faults.procfs import PodResolver
from gpushare.node.gpu.backend import GpuBackend, HealthEvent
from gpushare.node.load import Share, simulated_load
from gpushare.node.metrics import AgentCollector, Authorize, MetricsServer, Reply, registry_for
from gpushare.node.mps.manager import DaemonStarter, MpsManager, ShmMode
from gpushare.node.mps_limits import MpsLimitKeeper
from gpushare.packing.tenancy import TENANCY_NAMESPACE

log = logging.getLogger(__name__)

AgentMode = Literal["deviceplugin", "dra"]

# Volta (7.0) and newer run MPS with execution-resource provisioning (active-thread %).
MPS_MIN_CAPABILITY = (7, 0)


@dataclass(frozen=True)
class AgentSettings:
    """What the node agent runs with (``gpushare-node-agent --help`` sets each)."""

    node_name: str
    """The Kubernetes node this agent serves (pods bound here, node object patched)."""
    mode: AgentMode = "deviceplugin"
    """deviceplugin: offer gpushare.io/gpu-percent through the kubelet's device plugin API
    (annotated pods placed by gpushare-scheduler); dra: be the kubelet DRA plugin of driver
    gpu.gpushare.io and publish this node's ResourceSlice (pods with ResourceClaims placed by
    kube-scheduler) (docs/architecture.md, "Node agent: DRA mode")."""
    kubelet_root: Path = DEFAULT_KUBELET_ROOT
    """The kubelet's root directory; dra mode serves <kubelet-root>/plugins/gpu.gpushare.io/dra.sock
    and registers through <kubelet-root>/plugins_registry/."""
    cdi_dir: Path = DEFAULT_CDI_DIR
    """dra mode: where a CDI spec per prepared claim is written for the container runtime."""
    slice_resync_s: float = 30.0
    """dra mode: how often the node's ResourceSlice is checked (and written again if it was
    deleted, e.g. by a kubelet that saw the plugin gone)."""
    device_plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    """The kubelet's device-plugin directory (holds kubelet.sock and this plugin's socket)."""
    plugin_endpoint: str = DEFAULT_ENDPOINT
    """Socket file name of this plugin inside the device-plugin directory."""
    opportunistic_plugin_endpoint: str = OPPORTUNISTIC_ENDPOINT
    """Socket file name of the plugin serving gpushare.io/opportunistic-gpu-percent (300 device
    IDs per GPU, for pods the scheduler places beyond a GPU's guaranteed capacity;
    docs/node-agent.md, "Device IDs")."""
    mps_root: Path = Path("/run/gpushare/node/mps")
    """Root of the per-GPU MPS pipe/log/shm directories (<mps-root>/<uuid>/)."""
    mps_shm: ShmMode = "private"
    """private: each MPS daemon gets <mps-root>/<uuid>/shm as its /dev/shm and pods get the same
    directory (needs CAP_SYS_ADMIN); host: daemons and pods share the host's /dev/shm."""
    require_exclusive_process: bool = False
    """Advertise a GPU only when its compute mode is EXCLUSIVE_PROCESS (the admin sets it with
    nvidia-smi -c EXCLUSIVE_PROCESS): then only the MPS server may open the GPU, and a container
    pointing CUDA at an empty pipe directory cannot run outside MPS and its limits
    (docs/security.md)."""
    mps_daemons: DaemonStarter = "own"
    """own: the agent starts the MPS daemons itself (an agent run as a host process); launcher:
    gpushare-mps-launcher starts them when the agent asks (the chart's mps-launcher container),
    so they outlive the agent's container: a runtime ends every process of a stopped container,
    and running pods would lose their MPS server (docs/node-agent.md, "MPS daemons")."""
    tenancy: str = TENANCY_NAMESPACE
    """dra mode: namespace: a GPU's MPS server serves claims of one namespace or sharing group
    only (the controller's --tenancy; the chart sets both from tenancy.crossNamespaceSharing);
    cluster: no boundary (docs/dra.md, "Tenancy")."""
    metrics_host: str = "0.0.0.0"
    """Listen address of the metrics server."""
    metrics_port: int = AGENT_METRICS_PORT
    """Port serving /metrics, /healthz and the exporter's /profile; 0 picks a free port
    (logged)."""
    metrics_auth: str = "tokenreview"
    """Who may read /metrics and /profile (they name every pod on this node): tokenreview, a
    caller whose bearer token the API server authenticates and allows to get that non-resource
    URL (TokenReview + SubjectAccessReview; /profile only with a token bound to the audience
    gpushare.io/node-agent, which the controller's operator presents); none, anyone who
    reaches the port (docs/security.md, "Metrics and profiles")."""
    pod_resources_socket: Path | None = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    """The kubelet's pod-resources socket, for the exporter's per-container attribution."""
    allocation_state_file: Path | None = None
    """Where the device plugin keeps what each Allocate answered, across agent restarts
    (None: ``<device_plugin_dir>/gpushare/allocations.json``; a subdirectory, since a new
    kubelet deletes the plain files in its directory)."""
    pod_refresh_s: float = 5.0
    """How often the pods on this node are re-read for publishing, loads and metrics."""
    mps_check_s: float = 10.0
    """How often each MPS daemon is health-checked through its control pipe."""
    stop_mps_on_exit: bool = False
    """Quit the MPS daemons when the agent exits. Off by default: a restarted agent adopts them
    and the pods using them keep running."""
    exporter: bool = True
    """Wire in gpushare.node.exporter's collectors and /profile endpoint when installed."""
    fault_check_s: float = 0.5
    """How often the MPS daemons' logs are read for fatal client faults (gpushare.node.faults)."""
    exclusive_after_faults: int = 2
    """Fatal GPU faults a workload may be involved in, beside neighbours with none in common,
    within an hour before it is moved to a GPU of its own (0: never)."""


def mps_capable(gpus: list[GpuInfo]) -> bool:
    def capability(text: str) -> tuple[int, int]:
        major, _, minor = text.partition(".")
        return (int(major), int(minor or 0)) if major.isdigit() else (0, 0)

    return bool(gpus) and all(capability(g.compute_capability) >= MPS_MIN_CAPABILITY for g in gpus)


class NodeAgent:
    """One node's agent. ``run(stop)`` blocks until ``stop`` is set (SIGTERM)."""

    def __init__(
        self,
        settings: AgentSettings,
        *,
        backend: GpuBackend,
        kube: Any,
        device_nodes: Callable[[str], list[DeviceNode]] | None = None,
        dra_kube: Any = None,
        authorize: Authorize | None = None,
    ) -> None:
        """``kube`` is a gpushare.kube.node.NodeKube (PodSource plus publish/raw pod reads);
        ``dra_kube`` its DRA calls (gpushare.kube.dra.DraKube; default ``kube.dra()``), used in
        dra mode only; ``authorize`` admits callers of /metrics and /profile
        (``settings.metrics_auth``: main wires gpushare.kube.access; None: open)."""
        self.settings = settings
        self._authorize = authorize
        self.backend = backend
        self.kube = kube
        self.gpus = backend.inventory()
        self.health = DeviceHealth(g.uuid for g in self.gpus)
        self.mps = MpsManager(
            root=settings.mps_root,
            simulated=backend.simulated,
            shm_mode=settings.mps_shm,
            on_change=self._mps_changed,
            require_exclusive_process=settings.require_exclusive_process,
            daemons=settings.mps_daemons,
            on_event=self._mps_event,
        )
        self.dra: DraDriver | None = None
        self.mps_limits = MpsLimitKeeper(
            mps=self.mps,
            gpu_memory=lambda: {g.uuid: g.memory_bytes for g in self.gpus},
            claimed=lambda: self.dra.shares() if self.dra is not None else {},
        )
        pods: PodSource = kube
        kubelet_socket = settings.device_plugin_dir / KUBELET_SOCKET
        pod_resources = settings.pod_resources_socket
        self.allocator = Allocator(
            kubelet=lambda: kubelet_identity(kubelet_socket),
            held=(lambda: kubelet_held(socket_path=pod_resources)) if pod_resources else None,
            running=pods_with_running_containers,
            answers=AnswerBook(
                path=settings.allocation_state_file
                or settings.device_plugin_dir / STATE_DIR / STATE_FILE
            ),
            node_name=settings.node_name,
            gpus=self.inventory,
            pods=pods,
            mps=self.mps,
            device_nodes=device_nodes,
            nvidia_runtime_env=not backend.simulated,
            on_answer=self.mps_limits.raise_for,
        )
        self.runner = PluginRunner(
            make_servicer=self._new_servicer,
            plugin_dir=settings.device_plugin_dir,
            endpoint=settings.plugin_endpoint,
        )
        # Opportunistic pods ask for their own resource (more of it than the GPU has), served
        # by the same Allocator: placements, not slice counts, set what a pod may use.
        self.opportunistic_runner = PluginRunner(
            make_servicer=lambda: self._new_servicer(opportunistic_slice_ids),
            plugin_dir=settings.device_plugin_dir,
            endpoint=settings.opportunistic_plugin_endpoint,
            resource_name=RESOURCE_GPU_OPPORTUNISTIC,
        )
        self.slices: SlicePublisher | None = None
        self.dra_runner: DraPluginRunner | None = None
        if settings.mode == "dra":
            dra_api = dra_kube if dra_kube is not None else kube.dra()
            driver = DraDriver(
                node_name=settings.node_name,
                gpus=self.inventory,
                claims=dra_api,
                checkpoint=Checkpoint(plugin_dir(settings.kubelet_root) / CHECKPOINT_FILE),
                cdi_dir=CdiDir(settings.cdi_dir),
                mps=self.mps,
                limits=self.mps_limits,
                on_release=self._resync_limits,
                device_nodes=device_nodes,
                nvidia_runtime_env=not backend.simulated,
                pods=lambda: [pod_info(m) for m in self.kube.raw_node_pods()],
                tenancy=settings.tenancy,
                namespace_labels=dra_api.namespace_labels,
                on_dropped=self._checkpoint_entry_dropped,
            )
            self.dra = driver
            self.slices = SlicePublisher(
                node_name=settings.node_name,
                store=dra_api,
                node_uid=getattr(dra_api, "node_uid", None),
            )
            self.dra_runner = DraPluginRunner(
                make_servicers=lambda: (DraPluginV1(driver), DraPluginV1beta1(driver)),
                kubelet_root=settings.kubelet_root,
            )
        self.faults = FaultMonitor(
            node_name=settings.node_name,
            log_dirs=lambda: {g.uuid: self.mps.paths(g.uuid).log for g in self.gpus},
            pods=self.pods,
            fresh_pods=getattr(kube, "raw_node_pods", None),
            kube=kube,
            resolver=PodResolver(candidates=self._client_pids),
            mps_check=lambda uuid: self.mps.check_one(uuid).up,
            exclusive_after=settings.exclusive_after_faults,
        )
        self.registry = registry_for("node-agent", simulated=backend.simulated)
        self._servicers: list[DevicePluginServicer] = []
        self._exporter: ExporterHandle | None = None
        self._publish_needed = threading.Event()
        self._published_ready = ""
        self._pods_lock = threading.Lock()
        self._pods: list[dict[str, Any]] = []
        self.metrics: MetricsServer | None = None

    # --- state ---------------------------------------------------------------------------

    def inventory(self) -> list[GpuInfo]:
        """The backend's GPUs with current health and MPS readiness."""
        status = self.mps.status()
        return [
            GpuInfo(
                uuid=g.uuid,
                index=g.index,
                model=g.model,
                memory_bytes=g.memory_bytes,
                sm_count=g.sm_count,
                compute_capability=g.compute_capability,
                healthy=self.health.healthy(g.uuid),
                mps_ready=bool(status.get(g.uuid) and status[g.uuid].up),
                simulated=g.simulated,
            )
            for g in self.gpus
        ]

    def pods(self) -> list[dict[str, Any]]:
        """Manifests of the pods on this node as of the last refresh."""
        with self._pods_lock:
            return list(self._pods)

    def _new_servicer(self, ids: Callable[[str], list[str]] = slice_ids) -> DevicePluginServicer:
        servicer = DevicePluginServicer(allocator=self.allocator, health=self.health, ids=ids)
        self._servicers.append(servicer)
        return servicer

    def _checkpoint_entry_dropped(self, claim: str, why: str) -> None:
        """A Warning Event on the node for a DRA checkpoint entry dropped at start."""
        if self.kube is None:
            return
        try:
            self.kube.record_event(
                pod=None,
                reason="GpushareCheckpointEntryDropped",
                message=f"DRA checkpoint entry {claim} dropped: {why}; the agent did not write "
                "it so, and the kubelet prepares that claim again",
                warning=True,
            )
        except Exception as exc:
            log.warning("could not report the dropped checkpoint entry %s: %s", claim, exc)

    def _resync_limits(self) -> None:
        """After an unprepare: the MPS servers' limits from the pods and claims left."""
        self.mps_limits.sync(self.pods())

    def _claim_placements(self) -> list[PodAllocation]:
        """DRA mode: the pods on this node holding claims this agent prepared."""
        if self.dra is None:
            return []
        return claim_allocations(self.dra.prepared().values(), self.pods())

    def _client_pids(self, uuid: str) -> list[int]:
        try:
            return [p.pid for p in self.backend.processes(uuid) if p.mps_client]
        except Exception:
            return []

    def _stats(self) -> dict[str, float]:
        _, state = self.health.snapshot()
        if self.dra is not None and self.dra_runner is not None:
            registrations = self.dra_runner.starts
            allocations, failures = self.dra.prepared_total, self.dra.failed_total
        else:
            registrations = self.runner.registrations
            allocations = sum(s.allocations for s in self._servicers)
            failures = sum(s.allocation_failures for s in self._servicers)
        return {
            "simulated": 1.0 if self.backend.simulated else 0.0,
            "registrations": float(registrations),
            "allocations": float(allocations),
            "allocation_failures": float(failures),
            "reallocations": float(self.allocator.reallocations),
            "placement_exchanges": float(self.allocator.exchanges),
            "healthy_gpus": float(sum(state.values())),
        }

    # --- reactions -----------------------------------------------------------------------

    def _mps_changed(self, uuid: str, up: bool, reason: str) -> None:
        problem = None if up else f"MPS daemon down: {reason}"
        if self.health.set_problem(uuid, "mps", problem):
            log.warning("GPU %s %s (%s)", uuid, "healthy" if up else "UNHEALTHY", problem or "ok")
        self._publish_needed.set()

    def _mps_event(self, uuid: str, reason: str, message: str, warning: bool) -> None:
        """A Node Event for a GPU's MPS daemon adopted, started, replaced or down; sent from a
        thread of its own, so a slow API server never holds up a daemon's start or check."""
        kube = self.kube
        if kube is None:
            return

        def send() -> None:
            try:
                kube.record_event(pod=None, reason=reason, message=message, warning=warning)
            except Exception as exc:
                log.warning("could not record %s for GPU %s: %s", reason, uuid, exc)

        threading.Thread(target=send, name=f"event-{reason}", daemon=True).start()

    def handle_health_event(self, event: HealthEvent) -> None:
        problem = None if event.healthy else event.reason
        if self.health.set_problem(event.uuid, "backend", problem):
            log.warning("GPU %s health: %s", event.uuid, event.reason)
        if self._exporter is not None:
            self._exporter.record_health(event)
        self._publish_needed.set()

    # --- node publishing -----------------------------------------------------------------

    def node_metadata(self) -> tuple[dict[str, str], dict[str, str | None]]:
        gpus = self.inventory()
        labels: dict[str, str | None] = {
            LABEL_MPS_CAPABLE: "true" if mps_capable(gpus) else None,
            LABEL_SIMULATED: "true" if self.backend.simulated else None,
        }
        ready = "true" if self.not_ready_reason() is None else "false"
        annotations = {
            ANN_NODE_GPUS: dump_inventory(gpus),
            ANN_AGENT_READY: ready,
            ANN_AGENT_MODE: self.settings.mode,
        }
        return annotations, labels

    def not_ready_reason(self) -> str | None:
        """Why a pod bound to this node now would fail the kubelet's admission (plugin not
        registered with the current kubelet, devices not yet listed to it, no healthy GPU);
        None when the kubelet has this agent's healthy devices. Published as the node's
        ``gpushare.io/agent-ready`` (the extender waits on it) and served as /readyz."""
        if self.dra_runner is not None:
            registration = self.dra_runner.registration
            if registration is None or not registration.registered.is_set():
                return "the DRA driver is not registered with the kubelet"
        else:
            if not self.runner.registered.is_set():
                return "the device plugin is not registered with the kubelet"
            servicer = self.runner.servicer
            if servicer is None or not servicer.listed.is_set():
                return "the kubelet has not listed the devices yet"
            if not self.opportunistic_runner.registered.is_set():
                return (
                    f"the {RESOURCE_GPU_OPPORTUNISTIC} device plugin is not registered with "
                    "the kubelet"
                )
        # Not counted: GPUs another device plugin advertises (they are its now). An agent left
        # with no GPU of its own manages nothing and is ready doing so, not stuck (#46).
        _, healthy = self.health.snapshot()
        own = [ok for u, ok in healthy.items() if OTHER_PLUGIN not in self.health.problems(u)]
        if own and not any(own):
            return "no healthy GPU"
        return None

    def _readyz(self, _query: str) -> Reply:
        reason = self.not_ready_reason()
        if reason is None:
            return Reply(200, "text/plain", b"ready\n")
        return Reply(503, "text/plain", f"not ready: {reason}\n".encode())

    def publish(self) -> None:
        annotations, labels = self.node_metadata()
        self._published_ready = annotations[ANN_AGENT_READY]
        self.kube.publish_node(annotations=annotations, labels=labels)
        log.info("published %d GPU(s) on node %s", len(self.gpus), self.settings.node_name)
        if self.slices is not None:
            try:
                self.slices.publish(self.inventory())
            except Exception as exc:
                log.warning("could not publish this node's ResourceSlice (%s); retrying", exc)
                self._publish_needed.set()

    def request_restart(self) -> None:
        """Serve and register the kubelet plugin of this mode again (SIGHUP)."""
        if self.dra_runner is not None:
            self.dra_runner.request_restart()
        else:
            self.runner.request_restart()
            self.opportunistic_runner.request_restart()

    # --- loops ---------------------------------------------------------------------------

    def _loop(
        self, name: str, stop: threading.Event, every_s: float, step: Callable[[], object]
    ) -> threading.Thread:
        def run() -> None:
            while not stop.is_set():
                try:
                    step()
                except Exception:
                    log.exception("%s loop step failed", name)
                stop.wait(every_s)

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        return thread

    def _health_loop(self, stop: threading.Event) -> threading.Thread:
        def run() -> None:
            while not stop.is_set():
                try:
                    for event in self.backend.wait_health_events(1.0):
                        self.handle_health_event(event)
                except Exception:
                    log.exception("health event loop failed")
                    stop.wait(1.0)

        thread = threading.Thread(target=run, name="gpu-health", daemon=True)
        thread.start()
        return thread

    def refresh_pods(self) -> None:
        # The last Allocate of a batch is checked here (the others at the next Allocate).
        if self.dra is None:
            self.allocator.reconcile()
        pods = self.kube.raw_node_pods()
        with self._pods_lock:
            self._pods = pods
        self.mps_limits.sync(pods)
        if self.backend.simulated:
            self.feed_simulated_load(pods)

    def feed_simulated_load(self, pods: list[dict[str, Any]]) -> None:
        """Give each simulated GPU the load of the pods running on it (gpushare.node.load): in
        DRA mode those of the claims prepared for running pods, at their thread caps or their
        guaranteed share when smaller, as annotated pods."""
        shares: dict[str, list[Share]] = defaultdict(list)
        running = set()
        for pod in pods:
            meta = pod.get("metadata") or {}
            if (pod.get("status") or {}).get("phase") == "Running":
                running.add(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
        for claim in self.dra.prepared().values() if self.dra is not None else ():
            if claim.pod in running:
                for device in claim.devices:
                    shares[device.gpu_uuid].append(
                        Share(claim.thread_percent, claim.memory_limit_bytes, claim.percent)
                    )
        for pod in pods:
            phase = (pod.get("status") or {}).get("phase")
            annotations = (pod.get("metadata") or {}).get("annotations") or {}
            if phase != "Running":
                continue
            try:
                placement = parse_placement(annotations)
            except InvalidInputError:
                continue
            if placement is None or placement.state != STATE_ALLOCATED:
                continue
            guaranteed = _guaranteed_percent(pod, gpus=len(placement.gpu_uuids))
            for uuid in placement.gpu_uuids:
                shares[uuid].append(
                    Share(placement.thread_percent, placement.memory_limit_bytes, guaranteed)
                )
        set_load = getattr(self.backend, "set_load", None)
        if set_load is None:
            return
        for gpu in self.gpus:
            load = simulated_load(gpu, shares.get(gpu.uuid, []))
            set_load(
                gpu.uuid,
                pipes=load.pipes,
                sm_occupancy=load.sm_occupancy,
                memory_used_bytes=load.memory_used_bytes,
            )

    def _publish_step(self) -> None:
        ready = "true" if self.not_ready_reason() is None else "false"
        if ready != self._published_ready:
            log.info("node agent %s", "ready" if ready == "true" else "not ready")
            self._publish_needed.set()
        if self._publish_needed.is_set():
            self._publish_needed.clear()
            self.publish()

    # --- run -----------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        settings = self.settings
        log.info(
            "node agent starting on %s: backend %s, %d GPU(s), simulated=%s",
            settings.node_name,
            self.backend.name,
            len(self.gpus),
            self.backend.simulated,
        )
        threads: list[threading.Thread] = []
        try:
            self.mps.ensure(g.uuid for g in self.gpus)
            try:
                # Before the GPUs are advertised: a new daemon starts with MPS's defaults.
                self.mps_limits.sync(self.kube.raw_node_pods())
            except Exception as exc:
                log.warning("could not read this node's pods to set MPS limits: %s", exc)
            self.publish()
            self.registry.register(
                AgentCollector(
                    node_name=settings.node_name,
                    stats=self._stats,
                    backend_name=self.backend.name,
                )
            )
            self.registry.register(self.faults.collector())
            self.metrics = MetricsServer(
                registry=self.registry,
                host=settings.metrics_host,
                port=settings.metrics_port,
                authorize=self._authorize,
            )
            if settings.exporter:
                self._exporter = wire_exporter(
                    registry=self.registry,
                    server=self.metrics,
                    backend=self.backend,
                    node_name=settings.node_name,
                    pods=self.pods,
                    mps=self.mps,
                    pod_resources_socket=settings.pod_resources_socket,
                    claim_placements=self._claim_placements if self.dra is not None else None,
                )
            self.metrics.add_route("/readyz", self._readyz)
            self.metrics.start()
            log.info("metrics on http://%s:%d/metrics", settings.metrics_host, self.metrics.port)
            threads.append(self._health_loop(stop))
            threads.append(self._loop("mps-check", stop, settings.mps_check_s, self.mps.check))
            threads.append(self._loop("pods", stop, settings.pod_refresh_s, self.refresh_pods))
            threads.append(
                self._loop("mps-faults", stop, settings.fault_check_s, self.faults.check)
            )
            threads.append(self._loop("publish", stop, 1.0, self._publish_step))
            slices = self.slices
            if slices is not None:
                threads.append(
                    self._loop(
                        "dra-slices",
                        stop,
                        settings.slice_resync_s,
                        lambda: slices.publish(self.inventory()),
                    )
                )
            if self.dra_runner is not None:
                self.dra_runner.run(stop)
            else:
                opportunistic = threading.Thread(
                    target=self.opportunistic_runner.run,
                    args=(stop,),
                    name="opportunistic-plugin",
                    daemon=True,
                )
                opportunistic.start()
                threads.append(opportunistic)
                self.runner.run(stop)
        finally:
            stop.set()
            self.health.close()
            for thread in threads:
                thread.join(timeout=5)
            if self._exporter is not None:
                self._exporter.stop()
            if self.metrics is not None:
                self.metrics.stop()
            if settings.stop_mps_on_exit:
                self.mps.stop_all()
            else:
                log.info("leaving MPS daemons running; the next agent adopts them")
            self.backend.close()
            log.info("node agent stopped")


def _guaranteed_percent(pod: dict[str, Any], *, gpus: int) -> int | None:
    """The pod's gpushare.io/gpu-percent per GPU (limits of all containers), None if unset."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        value = limits.get(RESOURCE_GPU_PERCENT)
        if value is None:
            continue
        try:
            total += int(str(value))
        except ValueError:
            return None
    if total <= 0:
        return None
    return total // max(1, gpus)
