"""The MPS daemons' own DaemonSet (node.mpsLauncher.runIn daemonSet): gpushare-mps-launcher on
every agent's node, with the agent's MPS root and host PIDs, never rolled by `helm upgrade`.
That deleting or killing the agent leaves the daemons' pods running is
tests/gpu_cluster/test_restart_faults.py (a real GPU)."""

from typing import Any

from gpushare.node.main import build_parser
from gpushare.node.mps.launcher import build_parser as launcher_parser
from tests.fixtures.helm_chart import Chart, container


def _component(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["labels"]["app.kubernetes.io/component"])


def test_with_real_gpus_mps_daemons_run_in_a_daemonset_helm_never_rolls(chart: Chart) -> None:
    """A stopped container's processes all end, and a deleted pod's containers all stop: with
    the NVML backend the agent asks gpushare-mps-launcher, in a DaemonSet of its own, to start
    the MPS daemons, with the agent's MPS root, shm mode, driver mounts, nodes and host PIDs.
    OnDelete: `helm upgrade` never deletes its pods (the clients' MPS servers live there)."""
    values = {
        "node": {
            "backend": "nvml",
            "mpsRoot": "/run/gs/mps",
            "mpsShm": "host",
            "extraVolumes": [{"name": "driver", "hostPath": {"path": "/opt/nvidia"}}],
            "extraVolumeMounts": [{"name": "driver", "mountPath": "/opt/nvidia"}],
            "extraEnv": [{"name": "PATH", "value": "/opt/nvidia/bin:/usr/bin"}],
            "runtimeClassName": "nvidia",
        }
    }
    rendered = chart.render(values)
    agent_ds = rendered.get("DaemonSet", "gpushare-node-agent")
    assert build_parser().parse_args(container(agent_ds, "agent")["args"]).mps_daemons == "launcher"
    assert [c["name"] for c in agent_ds["spec"]["template"]["spec"]["containers"]] == ["agent"]
    ds = rendered.get("DaemonSet", "gpushare-mps-daemons")
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    # Not the agent's pods: the agent's DaemonSet neither adopts nor rolls them.
    assert ds["spec"]["selector"]["matchLabels"] != agent_ds["spec"]["selector"]["matchLabels"]
    assert _component(ds) == "mps-daemons"
    pod = ds["spec"]["template"]["spec"]
    agent_pod = agent_ds["spec"]["template"]["spec"]
    for same in ("nodeSelector", "tolerations", "hostPID", "runtimeClassName", "priorityClassName"):
        assert pod.get(same) == agent_pod.get(same), same
    assert pod["hostPID"] is True
    assert pod["automountServiceAccountToken"] is False  # the launcher calls no API
    launcher = container(ds, "mps-launcher")
    assert launcher["command"] == ["gpushare-mps-launcher"]
    args = launcher_parser().parse_args(launcher["args"])
    assert (str(args.mps_root), args.mps_shm) == ("/run/gs/mps", "host")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in launcher["volumeMounts"]}
    assert mounts["/run/gs"]["hostPath"]["path"] == "/run/gs"  # the agent's MPS root, same path
    assert mounts["/opt/nvidia"]["hostPath"]["path"] == "/opt/nvidia"
    assert {"name": "PATH", "value": "/opt/nvidia/bin:/usr/bin"} in launcher["env"]
    assert launcher["securityContext"]["privileged"] is True
    assert "limits" not in launcher["resources"]  # the node's MPS servers run in its cgroup


def test_an_agent_setting_changes_the_agents_pods_not_the_mps_daemons(chart: Chart) -> None:
    """What `helm upgrade` with a new agent setting does: the agent's pod template changes (it
    rolls); the MPS daemons' template does not, and would not roll if it did (OnDelete)."""
    before = chart.render({"node": {"backend": "nvml"}})
    agent_only = {"gpus": ["0"], "requireExclusiveProcess": True, "otherPluginCheckSeconds": 5}
    after = chart.render({"node": {"backend": "nvml", **agent_only}})
    for name, changed in (("gpushare-node-agent", True), ("gpushare-mps-daemons", False)):
        templates = [r.get("DaemonSet", name)["spec"]["template"] for r in (before, after)]
        assert (templates[0] != templates[1]) is changed, name


def test_each_node_pool_gets_its_own_mps_daemons(chart: Chart) -> None:
    values = {
        "node": {
            "backend": "nvml",
            "nodeSelector": {"gpushare.io/mode": "deviceplugin"},
            "extraPools": [
                {"name": "dra", "mode": "dra", "nodeSelector": {"gpushare.io/mode": "dra"}}
            ],
        }
    }
    rendered = chart.render(values)
    for agent, daemons in (
        ("gpushare-node-agent", "gpushare-mps-daemons"),
        ("gpushare-node-agent-dra", "gpushare-mps-daemons-dra"),
    ):
        agent_pod = rendered.get("DaemonSet", agent)["spec"]["template"]["spec"]
        pod = rendered.get("DaemonSet", daemons)["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == agent_pod["nodeSelector"], daemons
