"""The node agent: wires the GPU backend, MPS daemons, the kubelet plugin of its mode, node
publishing, the fault monitor, pausing and metrics together and runs them until stopped. Each part
lives in its own package (docs/architecture.md); this module only builds and starts them.

Start order matters: MPS daemons are adopted or started first, the node inventory is
published, and only then is the kubelet plugin served and registered, so the kubelet never
advertises a GPU whose daemon is not there (it is advertised Unhealthy instead).
"""

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

from gpushare.api.agent_lease import AGENT_LEASE_RENEW_S
from gpushare.api.inventory import GpuInfo
from gpushare.api.names import RESOURCE_GPU_OPPORTUNISTIC
from gpushare.api.pod import PodInfo, pod_info
from gpushare.node import parts
from gpushare.node.coexistence import HEALTH_SOURCE as OTHER_PLUGIN
from gpushare.node.core.allocations import PodAllocation
from gpushare.node.core.answer import DeviceNode
from gpushare.node.core.health import DeviceHealth
from gpushare.node.core.serving import KubeletPlugin, RestartLoop
from gpushare.node.deviceplugin.devices import slice_ids
from gpushare.node.deviceplugin.kubelet_count import KubeletCount
from gpushare.node.deviceplugin.server import DevicePluginServicer
from gpushare.node.dra.allocations import claim_allocations
from gpushare.node.dra.cdi import CdiDir
from gpushare.node.dra.checkpoint import CHECKPOINT_FILE, Checkpoint
from gpushare.node.dra.driver import DraDriver
from gpushare.node.dra.plugin import DraPluginSockets, plugin_dir
from gpushare.node.dra.server import DraPluginV1, DraPluginV1beta1
from gpushare.node.dra.slices import SlicePublisher
from gpushare.node.extension import ExporterHandle, wire_exporter
from gpushare.node.gpu.backend import GpuBackend, HealthEvent
from gpushare.node.metrics import AgentCollector, Authorize, MetricsServer, Reply, registry_for
from gpushare.node.mps.limits import MpsLimitKeeper
from gpushare.node.parts import new_allocator, new_device_plugins, new_fault_monitor, new_mps
from gpushare.node.pausing.loop import pause_loop
from gpushare.node.publishing import AgentLease, NodePublisher
from gpushare.node.settings import AgentSettings
from gpushare.node.simload import SimulatedLoadFeeder

log = logging.getLogger(__name__)


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
        self.dra: DraDriver | None = None
        self._build_mps_and_device_plugins(device_nodes)
        self.slices: SlicePublisher | None = None
        self.dra_plugin: DraPluginSockets | None = None
        if settings.mode == "dra":
            self._wire_dra(dra_kube if dra_kube is not None else kube.dra(), device_nodes)
        # One restart loop serves the mode's kubelet plugins again together.
        plugins: list[KubeletPlugin] = (
            [self.dra_plugin]
            if self.dra_plugin is not None
            else [self.device_plugin, self.opportunistic_plugin]
        )
        self.plugins = RestartLoop(plugins)
        self.faults = new_fault_monitor(
            settings,
            kube=kube,
            mps=self.mps,
            gpus=lambda: self.gpus,
            pods=self.pods,
            fresh_pods=self.read_pods if hasattr(kube, "raw_node_pods") else None,
            client_pids=self._client_pids,
        )
        self.registry = registry_for("node-agent", simulated=backend.simulated)
        self._servicers: list[DevicePluginServicer] = []
        self._exporter: ExporterHandle | None = None
        self.stopping = threading.Event()
        """Set when the agent begins to stop: it reads not ready from then on."""
        self.kubelet_count = KubeletCount(settings.pod_resources_socket)  # for readiness
        self.publisher = self._new_publisher()
        self.lease = AgentLease(
            node_name=settings.node_name, namespace=settings.lease_namespace, kube=kube
        )
        self.simulated_load = SimulatedLoadFeeder(
            backend=backend,
            gpus=self.gpus,
            prepared=lambda: self.dra.prepared().values() if self.dra is not None else (),
        )
        self._pods_lock = threading.Lock()
        self._pods: list[PodInfo] = []
        self.metrics: MetricsServer | None = None

    # --- construction --------------------------------------------------------------------

    def _build_mps_and_device_plugins(
        self, device_nodes: Callable[[str], list[DeviceNode]] | None
    ) -> None:
        """The MPS daemons, the limits kept on them, and the device plugin's Allocator and
        sockets (built in either mode; served in device-plugin mode only)."""
        settings, backend, kube = self.settings, self.backend, self.kube
        self.mps = new_mps(
            settings,
            simulated=backend.simulated,
            on_change=self._mps_changed,
            on_event=self._mps_event,
        )
        self.mps_limits = MpsLimitKeeper(
            mps=self.mps,
            gpu_memory=lambda: {g.uuid: g.memory_bytes for g in self.gpus},
            claimed=lambda: self.dra.shares() if self.dra is not None else {},
        )
        self.allocator = new_allocator(
            settings,
            pods=kube,
            gpus=self.inventory,
            mps=self.mps,
            device_nodes=device_nodes,
            simulated=backend.simulated,
            on_answer=self.mps_limits.raise_for,
        )
        self.device_plugin, self.opportunistic_plugin = new_device_plugins(
            settings, self._new_servicer
        )

    def _new_publisher(self) -> NodePublisher:
        """The node publisher: inventory, readiness and (DRA mode) ResourceSlices."""
        settings = self.settings
        return NodePublisher(
            node_name=settings.node_name,
            mode=settings.mode,
            simulated=self.backend.simulated,
            kube=self.kube,
            inventory=self.inventory,
            not_ready_reason=self.not_ready_reason,
            slices=self.slices,
        )

    def _wire_dra(
        self, dra_api: Any, device_nodes: Callable[[str], list[DeviceNode]] | None
    ) -> None:
        """DRA mode: the driver (claims prepared from its checkpoint), the ResourceSlice
        publisher and the kubelet plugin sockets serving the driver."""
        settings = self.settings
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
            nvidia_runtime_env=not self.backend.simulated,
            vendor_cdi=self.allocator.vendor_cdi,
            pods=self.read_pods,
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
        self.dra_plugin = DraPluginSockets(
            make_servicers=lambda: (DraPluginV1(driver), DraPluginV1beta1(driver)),
            kubelet_root=settings.kubelet_root,
        )

    # --- state ---------------------------------------------------------------------------

    def inventory(self) -> list[GpuInfo]:
        """The backend's GPUs with current health and MPS readiness."""
        status = self.mps.status()
        return [
            dataclasses.replace(
                g,
                healthy=self.health.healthy(g.uuid),
                mps_ready=bool(status.get(g.uuid) and status[g.uuid].up),
            )
            for g in self.gpus
        ]

    def pods(self) -> list[PodInfo]:
        """The pods on this node as of the last refresh (the agent's one projection of each)."""
        with self._pods_lock:
            return list(self._pods)

    def read_pods(self) -> list[PodInfo]:
        """The pods bound to this node, read fresh from the API server and projected once
        (``PodInfo``: placement annotations parsed there, for every part of the agent)."""
        return [pod_info(m) for m in self.kube.raw_node_pods()]

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
        if self.dra is not None and self.dra_plugin is not None:
            registrations = self.dra_plugin.starts
            allocations, failures = self.dra.prepared_total, self.dra.failed_total
        else:
            registrations = self.device_plugin.registrations
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
        self.publisher.request()

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
        self.publisher.request()

    # --- readiness -----------------------------------------------------------------------

    def not_ready_reason(self) -> str | None:
        """Why a pod bound to this node now would fail the kubelet's admission (plugin not
        registered with the current kubelet, devices not yet listed to it, no healthy GPU);
        None when the kubelet has this agent's healthy devices. Published as the node's
        ``gpushare.io/agent-ready`` (the extender waits on it) and served as /readyz."""
        if self.stopping.is_set():
            return "the node agent is stopping"
        if self.dra_plugin is not None:
            registration = self.dra_plugin.registration
            if registration is None or not registration.registered.is_set():
                return "the DRA driver is not registered with the kubelet"
        else:
            if not self.device_plugin.registered.is_set():
                return "the device plugin is not registered with the kubelet"
            servicer = self.device_plugin.servicer
            if servicer is None or not servicer.listed.is_set():
                return "the kubelet has not listed the devices yet"
            if not self.opportunistic_plugin.registered.is_set():
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
        servicer = self.device_plugin.servicer if self.dra_plugin is None else None
        if (
            servicer is not None
            and any(own)
            and not self.kubelet_count.counted((id(servicer), servicer.listings))
        ):
            return "the kubelet has the device list but does not count the devices yet"
        return None

    def _readyz(self, _query: str) -> Reply:
        reason = self.not_ready_reason()
        if reason is None:
            return Reply(200, "text/plain", b"ready\n")
        return Reply(503, "text/plain", f"not ready: {reason}\n".encode())

    def request_restart(self) -> None:
        """Serve and register the kubelet plugin of this mode again (SIGHUP)."""
        self.plugins.request_restart()

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
        pods = self.read_pods()
        with self._pods_lock:
            self._pods = pods
        self.mps_limits.sync(pods)
        if self.backend.simulated:
            self.simulated_load.feed(pods)

    # --- run -----------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Start the agent's parts in order (lease, MPS daemons and their limits, node
        inventory, metrics, loops, then the kubelet plugins) and serve until ``stop``."""
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
            # First: the controller judges this node's agent by its Lease, alive from here on.
            threads.append(self._loop("lease", stop, AGENT_LEASE_RENEW_S, self.lease.renew))
            self.mps.ensure(g.uuid for g in self.gpus)
            try:
                # Before the GPUs are advertised: a new daemon starts with MPS's defaults.
                self.mps_limits.sync(self.read_pods())
            except Exception as exc:
                log.warning("could not read this node's pods to set MPS limits: %s", exc)
            self.publisher.publish()
            self._start_metrics()
            self._start_loops(stop, threads)
            self.plugins.run(stop)
        finally:
            self._shut_down(stop, threads)

    def _start_metrics(self) -> None:
        """Register the agent's collectors (and the exporter's, when on) and serve /metrics
        and /readyz."""
        settings = self.settings
        self.registry.register(
            AgentCollector(
                node_name=settings.node_name,
                stats=self._stats,
                backend_name=self.backend.name,
            )
        )
        self.registry.register(self.faults.collector())
        self.pausing = pause_loop(self.kube, settings, dra=lambda: self.dra)  # started below
        self.registry.register(self.pausing.collector(settings.node_name))
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

    def _start_loops(self, stop: threading.Event, threads: list[threading.Thread]) -> None:
        """Start the periodic loops, each added to ``threads`` as it starts (so a failure
        part way still joins those already running)."""
        settings = self.settings
        threads.append(self._health_loop(stop))
        threads.append(self._loop("mps-check", stop, settings.mps_check_s, self.mps.check))
        threads.append(self._loop("pods", stop, settings.pod_refresh_s, self.refresh_pods))
        threads.append(self._loop("mps-faults", stop, settings.fault_check_s, self.faults.check))
        threads.append(self._loop("publish", stop, 1.0, self.publisher.step))
        threads.append(self.pausing.start(stop))
        if drain := parts.new_gpu_operator_drain(settings, kube=self.kube, agent=self):
            threads.append(self._loop("gpu-operator", stop, drain.every_s, drain.step))
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

    def _shut_down(self, stop: threading.Event, threads: list[threading.Thread]) -> None:
        """Stop everything started: loops, exporter, metrics, MPS daemons (unless they are
        left for the next agent to adopt) and the backend."""
        stop.set()
        self.stopping.set()
        self.publisher.publish_stopping()
        self.health.close()
        for thread in threads:
            thread.join(timeout=5)
        if self._exporter is not None:
            self._exporter.stop()
        if self.metrics is not None:
            self.metrics.stop()
        if self.settings.stop_mps_on_exit:
            self.mps.stop_all()
        else:
            log.info("leaving MPS daemons running; the next agent adopts them")
        self.backend.close()
        log.info("node agent stopped")
