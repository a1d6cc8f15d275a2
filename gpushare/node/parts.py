"""How the node agent's parts are built from its settings: the MPS daemon manager, the device
plugin's Allocator and sockets, and the MPS fault monitor. Each takes what it needs explicitly
(settings, callbacks into the agent); :mod:`gpushare.node.agent` wires them together and runs
them (docs/architecture.md).
"""

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from gpushare.api.inventory import GpuInfo
from gpushare.api.names import ANN_EVICT, RESOURCE_GPU_OPPORTUNISTIC
from gpushare.api.pod import PodInfo
from gpushare.node.core.answer import DeviceNode
from gpushare.node.core.cgroups import pods_with_running_containers
from gpushare.node.core.health import DeviceHealth
from gpushare.node.core.pods import PodSource
from gpushare.node.core.vendor_cdi import SPEC_DIRS, VendorCdi
from gpushare.node.deviceplugin.allocator import Allocator
from gpushare.node.deviceplugin.devices import opportunistic_slice_ids, slice_ids
from gpushare.node.deviceplugin.holdings import (
    STATE_DIR,
    STATE_FILE,
    AnswerBook,
    kubelet_held,
    kubelet_identity,
)
from gpushare.node.deviceplugin.plugin import KUBELET_SOCKET, DevicePluginSockets
from gpushare.node.deviceplugin.server import DevicePluginServicer
from gpushare.node.dra.driver import DraDriver
from gpushare.node.faults.actions import FaultKube
from gpushare.node.faults.monitor import FaultMonitor
from gpushare.node.faults.procfs import PodResolver
from gpushare.node.gpu_operator import GpuOperatorDrain, gpu_pods
from gpushare.node.mps.manager import MpsManager
from gpushare.node.publishing import NodePublisher
from gpushare.node.settings import AgentSettings

MakeServicer = Callable[[Callable[[str], list[str]]], DevicePluginServicer]
"""The agent's servicer factory, given how a GPU's device IDs are named."""


def new_mps(
    settings: AgentSettings,
    *,
    simulated: bool,
    on_change: Callable[[str, bool, str], None],
    on_event: Callable[[str, str, str, bool], None],
) -> MpsManager:
    """The MPS daemon manager, set up from the settings; its changes and events go back to the
    agent (GPU health, Node Events)."""
    return MpsManager(
        root=settings.mps_root,
        simulated=simulated,
        shm_mode=settings.mps_shm,
        on_change=on_change,
        require_exclusive_process=settings.require_exclusive_process,
        set_exclusive_process=settings.set_exclusive_process,
        daemons=settings.mps_daemons,
        on_event=on_event,
    )


def new_allocator(
    settings: AgentSettings,
    *,
    pods: PodSource,
    gpus: Callable[[], Sequence[GpuInfo]],
    mps: MpsManager,
    device_nodes: Callable[[str], list[DeviceNode]] | None,
    simulated: bool,
    on_answer: Callable[[str, int, int], None] | None,
) -> Allocator:
    """The device plugin's Allocator: it asks the kubelet (its identity, and the pod resources
    socket when set) what is held, and keeps its answers in the state file so a restarted
    agent answers the kubelet the same."""
    kubelet_socket = settings.device_plugin_dir / KUBELET_SOCKET
    pod_resources = settings.pod_resources_socket
    return Allocator(
        kubelet=lambda: kubelet_identity(kubelet_socket),
        held=(lambda: kubelet_held(socket_path=pod_resources)) if pod_resources else None,
        running=pods_with_running_containers,
        answers=AnswerBook(
            path=settings.allocation_state_file
            or settings.device_plugin_dir / STATE_DIR / STATE_FILE
        ),
        node_name=settings.node_name,
        gpus=gpus,
        pods=pods,
        mps=mps,
        device_nodes=device_nodes,
        nvidia_runtime_env=not simulated,
        vendor_cdi=new_vendor_cdi(settings),
        on_answer=on_answer,
    )


def new_vendor_cdi(settings: AgentSettings) -> VendorCdi:
    """The GPUs' CDI device names on CDI nodes, read from the runtime's spec directories (and
    the DRA mode's, when the chart moved it)."""
    dirs = [*SPEC_DIRS, *([settings.cdi_dir] if settings.cdi_dir not in SPEC_DIRS else [])]
    return VendorCdi(settings.vendor_cdi, dirs=dirs)


def new_device_plugins(
    settings: AgentSettings, make_servicer: MakeServicer
) -> tuple[DevicePluginSockets, DevicePluginSockets]:
    """The device plugin sockets: the GPU slice resource and the opportunistic one."""
    device_plugin = DevicePluginSockets(
        make_servicer=lambda: make_servicer(slice_ids),
        plugin_dir=settings.device_plugin_dir,
        endpoint=settings.plugin_endpoint,
    )
    # Opportunistic pods ask for their own resource (more of it than the GPU has), served by
    # the same Allocator: placements, not slice counts, set what a pod may use.
    opportunistic_plugin = DevicePluginSockets(
        make_servicer=lambda: make_servicer(opportunistic_slice_ids),
        plugin_dir=settings.device_plugin_dir,
        endpoint=settings.opportunistic_plugin_endpoint,
        resource_name=RESOURCE_GPU_OPPORTUNISTIC,
    )
    return device_plugin, opportunistic_plugin


def new_fault_monitor(
    settings: AgentSettings,
    *,
    kube: FaultKube | None,
    mps: MpsManager,
    gpus: Callable[[], Sequence[GpuInfo]],
    pods: Callable[[], list[PodInfo]],
    fresh_pods: Callable[[], list[PodInfo]] | None,
    client_pids: Callable[[str], list[int]],
) -> FaultMonitor:
    """The MPS fault monitor: it reads each GPU's MPS log, resolves client pids to pods and
    separates a pod whose faults keep hitting a shared GPU."""
    return FaultMonitor(
        node_name=settings.node_name,
        log_dirs=lambda: {g.uuid: mps.paths(g.uuid).log for g in gpus()},
        pods=pods,
        fresh_pods=fresh_pods,
        kube=kube,
        resolver=PodResolver(candidates=client_pids),
        mps_check=lambda uuid: mps.check_one(uuid).up,
        exclusive_after=settings.exclusive_after_faults,
    )


class DrainHost(Protocol):
    """What draining for the GPU Operator reads of the node agent."""

    gpus: list[GpuInfo]
    health: DeviceHealth
    mps: MpsManager
    dra: DraDriver | None
    publisher: NodePublisher

    def read_pods(self) -> list[PodInfo]: ...


def new_gpu_operator_drain(
    settings: AgentSettings, *, kube: Any, agent: DrainHost
) -> GpuOperatorDrain | None:
    """Draining for the GPU Operator's driver upgrades and MIG changes (None when off, or
    without a Kubernetes client that reads the node): the node's labels read through ``kube``,
    the agent's gpushare pods (placed here, or holding a claim it prepared) marked for the
    controller to evict, its GPUs marked unhealthy meanwhile (so it reads not ready), its MPS
    daemons stopped and started, its node published again."""
    if not hasattr(kube, "node_labels") or settings.gpu_operator_check_s <= 0:
        return None

    def claimed() -> list[str]:
        prepared = agent.dra.prepared().values() if agent.dra is not None else ()
        return [f"{c.namespace}/{c.pod}" for c in prepared if c.pod]

    return GpuOperatorDrain(
        node_labels=kube.node_labels,
        gpu_pods=lambda: gpu_pods(agent.read_pods(), claimed()),
        mark_for_eviction=lambda pod, why: kube.annotate_pod(
            namespace=pod.namespace, name=pod.name, annotations={ANN_EVICT: why}
        ),
        event=lambda pod, reason, message, warning: kube.record_event(
            pod=pod, reason=reason, message=message, warning=warning
        ),
        stop_mps=agent.mps.stop_all,
        start_mps=lambda: agent.mps.ensure(g.uuid for g in agent.gpus),
        changed=agent.publisher.request,
        marker_dir=settings.mps_root,
        every_s=settings.gpu_operator_check_s,
        health=agent.health,
    )
