"""What the node agent runs with: ``AgentSettings``, one field per ``gpushare-node-agent``
flag (gpushare.node.main builds it; docs/node-agent.md lists the flags)."""

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpushare.api.names import AGENT_METRICS_PORT
from gpushare.node.deviceplugin.plugin import DEFAULT_ENDPOINT, OPPORTUNISTIC_ENDPOINT
from gpushare.node.dra.cdi import DEFAULT_CDI_DIR
from gpushare.node.dra.plugin import DEFAULT_KUBELET_ROOT
from gpushare.node.mps.manager import DaemonStarter, ShmMode
from gpushare.packing.tenancy import TENANCY_NAMESPACE

AgentMode = Literal["deviceplugin", "dra"]


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
    vendor_cdi: str = "auto"
    """How containers get the GPU itself on nodes whose runtime injects GPUs from CDI specs (GPU
    Operator >= v25.10): auto, name each GPU's device of kind nvidia.com/gpu from the specs in
    /etc/cdi and /var/run/cdi (by UUID, else index; none found: no name); off; or a CDI kind,
    always <kind>=<UUID>. The names go into Allocate's answer and each prepared claim's CDI IDs
    (docs/coexistence.md, "CDI nodes")."""
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
    set_exclusive_process: bool = False
    """Set a managed GPU's compute mode to EXCLUSIVE_PROCESS before its MPS daemon starts, when
    no process is on it (as NVIDIA's device plugin does for MPS): then a container pointing
    CUDA at an empty pipe directory cannot leave MPS. Off for the agent binary; the chart turns
    it on (node.setExclusiveProcess) (docs/security.md, "Containers stay inside MPS")."""
    mps_daemons: DaemonStarter = "own"
    """own: the agent starts the MPS daemons itself (an agent run as a host process); launcher:
    gpushare-mps-launcher starts them when the agent asks (the chart's mps-launcher container),
    so they outlive the agent's container: a runtime ends every process of a stopped container,
    and running pods would lose their MPS server (docs/node-agent.md, "MPS daemons")."""
    tenancy: str = TENANCY_NAMESPACE
    """dra mode: namespace: a GPU's MPS server serves claims of one namespace or sharing group
    only (the controller's --tenancy; the chart sets both from tenancy.crossNamespaceSharing);
    cluster: no boundary (docs/dra.md, "Tenancy")."""
    lease_namespace: str = "default"
    """Namespace of this agent's Lease, ``gpushare-agent-<node>``, renewed every 2 s: the
    controller places no new pod on a node whose agent stopped renewing it (the chart: the
    release namespace; empty: keep no Lease, and the node is judged as an older agent's;
    gpushare.api.agent_lease)."""
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
    cgroup_root: Path = Path("/sys/fs/cgroup")
    """Where the host's cgroup fs is mounted (the chart mounts it at /host/sys/fs/cgroup): the
    agent pauses a pod by freezing its containers' cgroups there, through cgroup v2's
    cgroup.freeze or cgroup v1's freezer (docs/node-agent.md, "Pausing a pod")."""
    pause_resync_s: float = 10.0
    """How often every pod's pause is checked against its cgroups without a change to react
    to (a watch of this node's pods wakes the pause loop at once)."""
    gpu_operator_check_s: float = 2.0
    """How often the node's labels are read for the GPU Operator's driver upgrades and MIG
    changes, which drain gpushare's pods and MPS daemons off the node (gpushare.node.gpu_operator;
    0: never)."""
