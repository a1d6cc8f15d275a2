"""The node agent DaemonSet: the agent's real flags, host paths, privileges only where needed."""

from typing import Any

from gpushare.api.gpu_operator import (
    DEPLOY_CLIENT,
    DEPLOY_DEVICE_PLUGIN,
    MIG_CONFIG_STATE,
    MIG_DRAIN_STATES,
    UPGRADE_DRAIN_STATES,
    UPGRADE_STATE,
)
from gpushare.api.names import LABEL_MPS_CAPABLE
from gpushare.node.main import build_parser
from tests.fixtures.helm_chart import LOCAL_VALUES, Chart, container


def _ds(chart: Chart, values: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    return chart.render(values, **kw).get("DaemonSet", "gpushare-node-agent")


def _agent(ds: dict[str, Any]) -> dict[str, Any]:
    return container(ds, "agent")


def _component(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["labels"]["app.kubernetes.io/component"])


def test_flags_parse_with_the_agents_own_parser(chart: Chart) -> None:
    c = _agent(_ds(chart, values_files=[LOCAL_VALUES]))
    assert c["command"] == ["gpushare-node-agent"]
    args = build_parser().parse_args(c["args"])
    assert args.backend == "simulated:2xH100-80GB"
    assert args.node_name == "$(NODE_NAME)"
    assert str(args.device_plugin_dir) == "/var/lib/kubelet/device-plugins"
    assert str(args.pod_resources_socket) == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert str(args.mps_root) == "/run/gpushare/node/mps"
    assert args.metrics_port == 9445
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert not args.require_exclusive_process  # the admin's compute mode is not assumed


def test_leaving_mps_is_closed_by_default_and_never_on_the_test_paths(chart: Chart) -> None:
    """The chart sets EXCLUSIVE_PROCESS on idle managed GPUs by default (issue 45); the values
    every real-GPU test installs (hack/gpu-host-e2e.sh) turn it off, as does a user's false."""
    default = build_parser().parse_args(_agent(_ds(chart))["args"])
    assert default.set_exclusive_process
    off = _agent(_ds(chart, {"node": {"setExclusiveProcess": False}}))
    assert not build_parser().parse_args(off["args"]).set_exclusive_process
    tests = _agent(_ds(chart, values_files=[LOCAL_VALUES]))
    assert not build_parser().parse_args(tests["args"]).set_exclusive_process
    assert not build_parser().parse_args(["--node-name", "n"]).set_exclusive_process


def test_the_agent_renews_its_lease_in_the_release_namespace(chart: Chart) -> None:
    c = _agent(_ds(chart, namespace="gpu-system"))
    assert build_parser().parse_args(c["args"]).lease_namespace == "gpu-system"


def test_exclusive_process_can_be_required(chart: Chart) -> None:
    c = _agent(_ds(chart, {"node": {"requireExclusiveProcess": True}}))
    assert build_parser().parse_args(c["args"]).require_exclusive_process


def test_host_directories_are_mounted_at_their_host_paths(chart: Chart) -> None:
    """The kubelet mounts MPS pipe dirs into pods by host path and connects to the plugin's
    socket in its own directory: the agent must see both at the same paths."""
    ds = _ds(chart, {"node": {"kubeletRoot": "/var/lib/k0s/kubelet", "mpsRoot": "/run/gs/mps"}})
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    for mount in _agent(ds)["volumeMounts"]:
        host = volumes[mount["name"]].get("hostPath")
        if host and mount["name"] != CGROUP_VOLUME:
            assert host["path"] == mount["mountPath"], mount
    args = build_parser().parse_args(_agent(ds)["args"])
    assert str(args.device_plugin_dir) == "/var/lib/k0s/kubelet/device-plugins"
    assert str(args.mps_root) == "/run/gs/mps"
    host_paths = {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v}
    assert host_paths == {
        "/var/lib/k0s/kubelet/device-plugins",
        "/var/lib/k0s/kubelet/pod-resources",
        "/run/gs",
        "/sys/fs/cgroup",
        # Read only: the NVIDIA CDI specs (node.vendorCdi auto).
        "/etc/cdi",
        "/var/run/cdi",
    }


def test_the_agent_reads_the_nvidia_cdi_specs_only_in_auto_mode(chart: Chart) -> None:
    """Issue #66, CDI nodes: auto reads the specs (read-only mounts), a named kind needs none."""
    for mode, dirs in (
        ("auto", {"/etc/cdi", "/var/run/cdi"}),
        ("nvidia.com/gpu", set()),
        ("off", set()),
    ):
        ds = _ds(chart, {"node": {"vendorCdi": mode}})
        volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
        mounts = [m for m in _agent(ds)["volumeMounts"] if m["name"].startswith("vendor-cdi")]
        assert {m["mountPath"] for m in mounts} == dirs
        assert all(m["readOnly"] for m in mounts)
        assert {volumes[m["name"]]["hostPath"]["path"] for m in mounts} == dirs
        assert build_parser().parse_args(_agent(ds)["args"]).vendor_cdi == mode
    assert "vendorCdi" in chart.fails({"node": {"vendorCdi": "yes please"}})


CGROUP_VOLUME = "host-cgroup"


def test_the_hosts_cgroup_fs_is_writable_beside_the_containers_own(chart: Chart) -> None:
    """Pausing a pod writes its containers' freezer files (cgroup v2 cgroup.freeze, v1
    freezer.state) in the host's cgroup fs: mounted writable, in both modes, at the path the
    agent's --cgroup-root names, and not over the container's own /sys/fs/cgroup."""
    for values in ({}, {"mode": "dra"}):
        ds = _ds(chart, values)
        volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
        assert volumes[CGROUP_VOLUME]["hostPath"] == {"path": "/sys/fs/cgroup", "type": "Directory"}
        mount = next(m for m in _agent(ds)["volumeMounts"] if m["name"] == CGROUP_VOLUME)
        assert not mount.get("readOnly")
        assert mount["mountPath"] != "/sys/fs/cgroup"
        args = build_parser().parse_args(_agent(ds)["args"])
        assert str(args.cgroup_root) == mount["mountPath"]


def test_simulated_gpus_run_without_privilege_or_host_pids(chart: Chart) -> None:
    ds = _ds(chart, values_files=[LOCAL_VALUES])
    pod = ds["spec"]["template"]["spec"]
    sc = _agent(ds)["securityContext"]
    assert "privileged" not in sc
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert "hostPID" not in pod
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in _agent(ds)["env"]}


def test_real_gpus_get_privilege_host_pids_and_the_driver(chart: Chart) -> None:
    ds = _ds(chart, {"node": {"runtimeClassName": "nvidia"}})
    pod = ds["spec"]["template"]["spec"]
    assert _agent(ds)["securityContext"]["privileged"] is True
    # Root whatever the image's USER (65532): the agent creates the MPS directories and serves
    # a socket in the kubelet's root-owned directory (an H100 run crashed without it).
    assert _agent(ds)["securityContext"]["runAsUser"] == 0
    assert _agent(ds)["securityContext"]["runAsGroup"] == 0
    assert pod["hostPID"] is True
    assert pod["runtimeClassName"] == "nvidia"
    env = {e["name"]: e.get("value") for e in _agent(ds)["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "compute" in env["NVIDIA_DRIVER_CAPABILITIES"]
    # Either can be forced.
    forced = _ds(chart, {"node": {"privileged": False, "hostPID": False}})
    assert "privileged" not in _agent(forced)["securityContext"]
    assert "hostPID" not in forced["spec"]["template"]["spec"]


def test_node_selector_is_not_the_label_the_agent_writes(chart: Chart) -> None:
    """The agent sets/removes gpushare.io/mps-capable itself; selecting on it would evict the
    agent whenever MPS is down, and never start it on a new node."""
    selector = _ds(chart)["spec"]["template"]["spec"]["nodeSelector"]
    assert selector == {"gpushare.io/enabled": "true"}
    assert LABEL_MPS_CAPABLE not in selector
    local = _ds(chart, values_files=[LOCAL_VALUES])["spec"]["template"]["spec"]["nodeSelector"]
    assert local == {"kubernetes.io/os": "linux"}


def test_uninstall_cleanup_hook_is_wired(chart: Chart) -> None:
    ds = _ds(chart)
    c = _agent(ds)
    assert c["lifecycle"]["preStop"]["exec"]["command"][-1] == "node-cleanup"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["DAEMONSET_NAME"] == "gpushare-node-agent"
    assert env["PLUGIN_SOCKET"] == "/var/lib/kubelet/device-plugins/gpushare-gpu-percent.sock"
    args = build_parser().parse_args(c["args"])
    assert env["PLUGIN_SOCKET"] == f"{args.device_plugin_dir}/{args.plugin_endpoint}"
    assert env["OPPORTUNISTIC_PLUGIN_SOCKET"] == (
        f"{args.device_plugin_dir}/{args.opportunistic_plugin_endpoint}"
    )
    assert env["MPS_ROOT"] == str(args.mps_root)
    off = _agent(_ds(chart, {"uninstall": {"cleanupNodes": False}}))
    assert "lifecycle" not in off


def test_metrics_port_and_probes(chart: Chart) -> None:
    c = _agent(_ds(chart, {"node": {"metrics": {"port": 19400}}}))
    assert build_parser().parse_args(c["args"]).metrics_port == 19400
    # Published on the node's address by default: the operator's profiler client reads
    # http://<node IP>:<port>/profile.
    assert c["ports"] == [{"name": "metrics", "containerPort": 19400, "hostPort": 19400}]
    off = _agent(_ds(chart, {"node": {"metrics": {"port": 19400, "hostPort": False}}}))
    assert off["ports"] == [{"name": "metrics", "containerPort": 19400}]
    # Ready only once the kubelet has the agent's healthy devices; alive while it serves.
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}


def test_agent_is_system_node_critical_by_default(chart: Chart) -> None:
    """As NVIDIA's device plugin: evicted last, preempts ordinary pods to start."""
    assert _ds(chart)["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical"
    plain = _ds(chart, {"node": {"priorityClassName": ""}})
    assert "priorityClassName" not in plain["spec"]["template"]["spec"]


def test_default_port_is_not_dcgm_exporters_and_the_operator_reaches_it(chart: Chart) -> None:
    """dcgm-exporter serves 9400 with a host port; gpushare's agent must not take it, and the
    operator's profiler client must find the agent where the chart publishes it."""
    from gpushare.api.names import AGENT_METRICS_PORT  # noqa: PLC0415
    from gpushare.cluster.operator.settings import OperatorConfig  # noqa: PLC0415

    c = _agent(_ds(chart))
    assert c["ports"] == [
        {"name": "metrics", "containerPort": AGENT_METRICS_PORT, "hostPort": AGENT_METRICS_PORT}
    ]
    assert AGENT_METRICS_PORT != 9400
    assert OperatorConfig().agent_url.endswith(f":{AGENT_METRICS_PORT}")
    assert build_parser().parse_args(["--node-name", "n"]).metrics_port == AGENT_METRICS_PORT


def test_gpu_selection_reaches_the_agent(chart: Chart) -> None:
    default = build_parser().parse_args(_agent(_ds(chart))["args"])
    assert default.gpus == "all" and default.other_plugin_check_seconds == 30
    values = {"node": {"gpus": [0, "GPU-8d3c1f0a-0000-4000-8000-000000000001"]}}
    args = build_parser().parse_args(_agent(_ds(chart, values))["args"])
    assert args.gpus == "0,GPU-8d3c1f0a-0000-4000-8000-000000000001"
    assert "node/gpus" in chart.fails({"node": {"gpus": ["first"]}})


def test_a_host_driver_can_be_mounted_without_the_nvidia_runtime(chart: Chart) -> None:
    """Where no NVIDIA container runtime injects the driver (docs/gpu-cluster.md), the values
    mount the host's driver directory into the agent and put it on PATH / LD_LIBRARY_PATH."""
    driver = "/usr/local/nvidia"
    ds = _ds(
        chart,
        {
            "node": {
                "backend": "nvml",
                "extraEnv": [{"name": "LD_LIBRARY_PATH", "value": f"{driver}/lib64"}],
                "extraVolumes": [{"name": "driver", "hostPath": {"path": driver}}],
                "extraVolumeMounts": [{"name": "driver", "mountPath": driver, "readOnly": True}],
            }
        },
    )
    c = _agent(ds)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["LD_LIBRARY_PATH"] == f"{driver}/lib64"
    assert "NODE_NAME" in env  # the chart's own variables stay
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["driver"] == {"name": "driver", "mountPath": driver, "readOnly": True}
    assert "device-plugins" in mounts
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["driver"]["hostPath"] == {"path": driver}


def test_extra_volume_mounts_need_a_mount_path(chart: Chart) -> None:
    error = chart.fails({"node": {"extraVolumeMounts": [{"name": "driver"}]}})
    assert "mountPath" in error


def _dra_args(c: dict[str, Any]) -> dict[str, str]:
    """The DRA flags of the agent's command line, read by the agent's own parser."""
    args = build_parser().parse_args(c["args"])
    return {
        "mode": args.mode,
        "kubelet_root": str(args.kubelet_root),
        "cdi_dir": str(args.cdi_dir),
    }


def _host_paths(ds: dict[str, Any]) -> dict[str, str]:
    """mountPath -> hostPath for every host directory the agent mounts (they must be equal)."""
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    out = {}
    for mount in _agent(ds)["volumeMounts"]:
        host = volumes[mount["name"]].get("hostPath")
        if host and mount["name"] != CGROUP_VOLUME:
            out[mount["mountPath"]] = host["path"]
    return out


def test_device_plugin_mode_passes_no_dra_flags(chart: Chart) -> None:
    c = _agent(_ds(chart))
    assert not [a for a in c["args"] if a.startswith(("--mode", "--kubelet-root", "--cdi-dir"))]
    assert not {"CDI_DIR", "DRA_PLUGIN_DIR"} & {e["name"] for e in c["env"]}
    assert _dra_args(c)["mode"] == "deviceplugin"


def test_dra_mode_serves_the_kubelet_plugin_api_instead_of_a_device_plugin(chart: Chart) -> None:
    """The kubelet finds a DRA driver by its registration socket in plugins_registry and dials
    plugins/<driver>/; containerd reads the CDI specs the driver writes. No device-plugin
    socket is served."""
    ds = _ds(chart, {"mode": "dra"}, values_files=[LOCAL_VALUES])
    c = _agent(ds)
    assert _dra_args(c) == {
        "mode": "dra",
        "kubelet_root": "/var/lib/kubelet",
        "cdi_dir": "/var/run/cdi",
    }
    assert not [a for a in c["args"] if a.startswith(("--device-plugin-dir", "--plugin-endpoint"))]
    paths = _host_paths(ds)
    assert all(mount == host for mount, host in paths.items()), paths
    assert set(paths) == {
        "/var/lib/kubelet/plugins/gpu.gpushare.io",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
        "/var/lib/kubelet/pod-resources",
        "/run/gpushare/node",
        "/etc/cdi",  # read only: the NVIDIA CDI specs (node.vendorCdi auto)
    }
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["PLUGIN_SOCKET"] == "/var/lib/kubelet/plugins_registry/gpu.gpushare.io-reg.sock"
    # What the uninstall clean-up empties: the directories the agent writes, as it is told them.
    assert env["CDI_DIR"] == _dra_args(c)["cdi_dir"]
    assert env["DRA_PLUGIN_DIR"] == "/var/lib/kubelet/plugins/gpu.gpushare.io"
    assert env["DRA_PLUGIN_DIR"] in paths
    # Same unprivileged security as the device-plugin mode with simulated GPUs.
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_dra_paths_follow_kubelet_root_and_cdi_dir(chart: Chart) -> None:
    values = {
        "mode": "dra",
        "node": {"kubeletRoot": "/var/lib/k0s/kubelet"},
        "dra": {"cdiDir": "/etc/cdi"},
    }
    ds = _ds(chart, values)
    assert _dra_args(_agent(ds))["kubelet_root"] == "/var/lib/k0s/kubelet"
    assert _dra_args(_agent(ds))["cdi_dir"] == "/etc/cdi"
    assert {
        "/var/lib/k0s/kubelet/plugins/gpu.gpushare.io",
        "/var/lib/k0s/kubelet/plugins_registry",
        "/etc/cdi",
    } <= set(_host_paths(ds))


def test_two_node_pools_run_each_mode_on_their_own_nodes(chart: Chart) -> None:
    """Device-plugin and DRA agents coexist: one DaemonSet per pool, each on its pool's nodes,
    selectors that do not adopt each other's pods, one ServiceAccount."""
    values = {
        "node": {
            "nodeSelector": {"gpushare.io/mode": "deviceplugin"},
            "extraPools": [
                {"name": "dra", "mode": "dra", "nodeSelector": {"gpushare.io/mode": "dra"}}
            ],
        }
    }
    rendered = chart.render(values)
    dp = rendered.get("DaemonSet", "gpushare-node-agent")
    dra = rendered.get("DaemonSet", "gpushare-node-agent-dra")
    agents = [d for d in rendered.all("DaemonSet") if _component(d) == "node-agent"]
    assert len(agents) == 2
    assert _dra_args(_agent(dp))["mode"] == "deviceplugin"
    assert _dra_args(_agent(dra))["mode"] == "dra"
    selector = {
        n: d["spec"]["template"]["spec"]["nodeSelector"] for n, d in (("dp", dp), ("dra", dra))
    }
    # Helm merges maps: the default opt-in label stays on the base pool only.
    assert selector["dp"] == {"gpushare.io/enabled": "true", "gpushare.io/mode": "deviceplugin"}
    assert selector["dra"] == {"gpushare.io/mode": "dra"}
    dra_match = dra["spec"]["selector"]["matchLabels"]
    assert dra_match["gpushare.io/node-pool"] == "dra"
    assert dra["spec"]["template"]["metadata"]["labels"]["gpushare.io/node-pool"] == "dra"
    assert "gpushare.io/node-pool" not in dp["spec"]["template"]["metadata"]["labels"]
    for ds in (dp, dra):
        assert ds["spec"]["template"]["spec"]["serviceAccountName"] == "gpushare-node-agent"
        env = {e["name"]: e.get("value") for e in _agent(ds)["env"]}
        assert env["DAEMONSET_NAME"] == ds["metadata"]["name"]  # the uninstall hook's own DS


def test_an_extra_pool_needs_a_name_mode_and_selector(chart: Chart) -> None:
    error = chart.fails({"node": {"extraPools": [{"name": "dra", "mode": "dra"}]}})
    assert "nodeSelector" in error, error
    error = chart.fails({"mode": "both"})
    assert "at '/mode'" in error, error


def test_the_launcher_can_run_in_the_agents_pod_or_not_at_all(chart: Chart) -> None:
    in_pod = chart.render({"node": {"backend": "nvml", "mpsLauncher": {"runIn": "agentPod"}}})
    ds = in_pod.get("DaemonSet", "gpushare-node-agent")
    assert build_parser().parse_args(_agent(ds)["args"]).mps_daemons == "launcher"
    names = [c["name"] for c in ds["spec"]["template"]["spec"]["containers"]]
    assert names == ["agent", "mps-launcher"]
    assert [_component(d) for d in in_pod.all("DaemonSet")] == ["node-agent"]
    off = chart.render({"node": {"backend": "nvml", "mpsLauncher": {"enabled": False}}})
    off_ds = off.get("DaemonSet", "gpushare-node-agent")
    assert build_parser().parse_args(_agent(off_ds)["args"]).mps_daemons == "own"
    assert [c["name"] for c in off_ds["spec"]["template"]["spec"]["containers"]] == ["agent"]
    assert [_component(d) for d in off.all("DaemonSet")] == ["node-agent"]
    simulated = chart.render({"node": {"backend": "simulated:1xH100-80GB"}})
    sim_ds = simulated.get("DaemonSet", "gpushare-node-agent")
    assert build_parser().parse_args(_agent(sim_ds)["args"]).mps_daemons == "own"
    assert [_component(d) for d in simulated.all("DaemonSet")] == ["node-agent"]
    error = chart.fails({"node": {"mpsLauncher": {"runIn": "host"}}})
    assert "runIn" in error, error


def test_a_dra_agent_holds_the_controllers_tenancy_boundary_between_claims(chart: Chart) -> None:
    args = build_parser().parse_args(_agent(_ds(chart, {"mode": "dra"}))["args"])
    assert args.tenancy == "namespace"
    shared = _ds(chart, {"mode": "dra", "tenancy": {"crossNamespaceSharing": True}})
    assert build_parser().parse_args(_agent(shared)["args"]).tenancy == "cluster"


def test_no_agent_while_the_gpu_operator_upgrades_the_driver_or_changes_mig(chart: Chart) -> None:
    """The GPU Operator's labels (gpushare.api.gpu_operator): a driver upgrade from pod
    deletion to the driver pod's restart, the mig-manager's pending/rebooting state, an operand
    label paused; a user's own required node affinity keeps its expressions and gets these
    added. The MPS daemons stay (the agent stops them once the node is drained)."""
    paused = ["paused-for-mig-change", "paused-for-driver-upgrade"]
    pause = [
        {
            "key": UPGRADE_STATE,
            "operator": "NotIn",
            "values": list(UPGRADE_DRAIN_STATES),
        },
        {"key": MIG_CONFIG_STATE, "operator": "NotIn", "values": list(MIG_DRAIN_STATES)},
        {"key": DEPLOY_DEVICE_PLUGIN, "operator": "NotIn", "values": paused},
        {"key": DEPLOY_CLIENT, "operator": "NotIn", "values": paused},
    ]
    own = {"key": "zone", "operator": "In", "values": ["a"]}
    values = {
        "node": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [own]}]
                    }
                }
            }
        }
    }
    for given, expected in (({}, pause), (values, [own, *pause])):
        rendered = chart.render(given)
        spec = rendered.get("DaemonSet", "gpushare-node-agent")["spec"]["template"]["spec"]
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"] == [{"matchExpressions": expected}]
        daemons = rendered.get("DaemonSet", "gpushare-mps-daemons")["spec"]["template"]["spec"]
        assert daemons.get("affinity", {}) == ({} if not given else values["node"]["affinity"])
    off = chart.render({"node": {"pauseForGpuOperator": False}})
    assert "affinity" not in off.get("DaemonSet", "gpushare-node-agent")["spec"]["template"]["spec"]


def test_the_agents_pod_waits_for_the_drain_and_can_be_a_gpu_operator_client(
    chart: Chart,
) -> None:
    ds = chart.render().get("DaemonSet", "gpushare-node-agent")
    spec = ds["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] == 270
    env = {e["name"]: e.get("value") for e in _agent(ds)["env"]}
    assert env["DRAIN_TIMEOUT_SECONDS"] == "240"
    assert "nvidia.com/gpu.deploy.client" not in spec["nodeSelector"]
    client = chart.render({"node": {"gpuOperatorClient": True}})
    for name in ("gpushare-node-agent",):
        selector = client.get("DaemonSet", name)["spec"]["template"]["spec"]["nodeSelector"]
        assert selector == {"gpushare.io/enabled": "true", "nvidia.com/gpu.deploy.client": "true"}
    # The MPS daemons do not select it: the operator would remove them with the agent, before
    # the drain is done.
    daemons = client.get("DaemonSet", "gpushare-mps-daemons")["spec"]["template"]["spec"]
    assert "nvidia.com/gpu.deploy.client" not in daemons.get("nodeSelector", {})
    unpaused = chart.render({"node": {"pauseForGpuOperator": False}})
    agent = unpaused.get("DaemonSet", "gpushare-node-agent")
    assert agent["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 30
