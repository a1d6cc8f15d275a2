"""The chart's defaults on a GPU-Operator-style node: NVIDIA's device plugin (a stand-in, as in
test_coexistence.py) advertises every GPU of the node as ``nvidia.com/gpu`` and GPU feature
discovery's label ``nvidia.com/gpu.present=true`` is set.

- A default install takes no node (gpushare owns the nodes labelled ``gpushare.io/enabled``):
  ``helm install --wait`` succeeds, every release pod is Ready, no agent is waiting anywhere.
- An admin labels the node for gpushare without turning NVIDIA's plugin off: the agent starts,
  manages no GPU (each is the other plugin's), says so in a Node Event, offers nothing, and is
  Ready: the DaemonSet's rollout completes (what KubeDaemonSetRolloutStuck and Argo CD read).
- The GPU Operator's mig-manager changes the MIG layout (``nvidia.com/mig.config.state=pending``):
  the agent leaves the node, marking it not ready for gpushare pods, and comes back afterwards.

Uses the chart release fixtures of tests/fixtures/chart_release.py.
"""

from typing import Any

import pytest

from gpushare.api.names import ANN_AGENT_READY, RESOURCE_GPU_PERCENT
from gpushare.node.gpu.simulated import simulated_uuid
from tests.cluster.test_coexistence import OTHER_RESOURCE, OtherPlugin, allocatable, node_events
from tests.fixtures.chart_release import (
    NAMESPACE,
    RELEASE,
    component,
    exclusive_node,
    helm,
    kjson,
    ready,
    release_pods,
    remove_release,
    wait_for,
    wait_ready_release_pods,
)
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.helm_chart import CHART

pytestmark = [pytest.mark.cluster, pytest.mark.whole_node]

AGENTS = f"{RELEASE}-node-agent"
GFD_LABEL = "nvidia.com/gpu.present"
OWNED_LABEL = "gpushare.io/enabled"
MIG_STATE = "nvidia.com/mig.config.state"


def agent_daemonset(cluster: LocalCluster) -> dict[str, Any]:
    return kjson(cluster, "get", "daemonset", "-n", NAMESPACE, AGENTS)["status"]  # type: ignore[no-any-return]


def test_beside_nvidias_device_plugin_the_default_install_is_not_stuck(
    cluster: LocalCluster, images: None
) -> None:
    uuids = [simulated_uuid(cluster.node_name, i) for i in range(2)]
    other = OtherPlugin(uuids)
    with exclusive_node(cluster):
        remove_release(cluster)
        try:
            other.start()
            wait_for(
                lambda: allocatable(cluster, OTHER_RESOURCE) == 2,
                timeout_s=60,
                what=f"the kubelet to offer 2 {OTHER_RESOURCE}",
            )
            cluster.kubectl("label", "node", cluster.node_name, f"{GFD_LABEL}=true", "--overwrite")
            # Default values, but for a cluster without GPUs or DNS (the simulated backend,
            # the extender's pinned IP); the node selector is the chart's default.
            helm(
                cluster, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                "--create-namespace", "--set", "node.backend=simulated:2xH100-80GB",
                "--set", "controller.service.clusterIP=10.96.88.88",
                "--wait", "--timeout", "5m",
            )  # fmt: skip
            status = agent_daemonset(cluster)
            assert status["desiredNumberScheduled"] == 0, status
            # helm --wait counts a Deployment ready at its minimum available replicas: give the
            # rest of the release's pods their first readiness probe (a stuck install never
            # gets there).
            pods = wait_ready_release_pods(cluster, timeout_s=60)
            assert pods and all(ready(p) for p in pods), [
                (p["metadata"]["name"], p["status"].get("conditions")) for p in pods
            ]
            assert "node-agent" not in {component(p) for p in pods}

            # Opted in while NVIDIA's plugin still owns every GPU: inert, and Ready.
            cluster.kubectl("label", "node", cluster.node_name, f"{OWNED_LABEL}=true")
            wait_for(
                lambda: (
                    (s := agent_daemonset(cluster))["desiredNumberScheduled"] == 1
                    and s.get("numberReady") == 1
                    and s.get("updatedNumberScheduled") == 1
                ),
                timeout_s=180,
                what="the node agent scheduled, Ready and up to date",
            )
            reasons = wait_for(
                lambda: {e["reason"]: e for e in node_events(cluster)}.get("NoGpuManaged"),
                timeout_s=60,
                what="a NoGpuManaged Node Event",
            )
            assert "manages no GPU" in reasons["message"]
            assert allocatable(cluster, RESOURCE_GPU_PERCENT) == 0
            assert allocatable(cluster, OTHER_RESOURCE) == 2, "NVIDIA's GPUs stay NVIDIA's"
            # helm --wait on an upgrade counts it as rolled out too.
            helm(
                cluster, "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE,
                "--reuse-values", "--set", "node.logLevel=DEBUG", "--wait", "--timeout", "3m",
            )  # fmt: skip
            wait_for(
                lambda: (
                    (s := agent_daemonset(cluster)).get("numberReady") == 1
                    and s.get("updatedNumberScheduled") == 1
                ),
                timeout_s=180,
                what="the upgraded node agent Ready",
            )

            # The mig-manager changes the MIG layout: no agent meanwhile, the node marked not
            # ready for gpushare pods; afterwards the agent is back on the new layout.
            cluster.kubectl(
                "label", "node", cluster.node_name, f"{MIG_STATE}=pending", "--overwrite"
            )
            wait_for(
                lambda: (
                    agent_daemonset(cluster)["desiredNumberScheduled"] == 0
                    and not [p for p in release_pods(cluster) if component(p) == "node-agent"]
                ),
                timeout_s=120,
                what="no node agent while the MIG layout changes",
            )
            annotations = kjson(cluster, "get", "node", cluster.node_name)["metadata"][
                "annotations"
            ]
            assert annotations.get(ANN_AGENT_READY) == "false"
            cluster.kubectl(
                "label", "node", cluster.node_name, f"{MIG_STATE}=success", "--overwrite"
            )
            wait_for(
                lambda: (
                    (s := agent_daemonset(cluster)).get("numberReady") == 1
                    and s["desiredNumberScheduled"] == 1
                ),
                timeout_s=180,
                what="the node agent back and Ready after the MIG change",
            )
        finally:
            remove_release(cluster)
            other.stop()
            cluster.kubectl("label", "node", cluster.node_name, f"{GFD_LABEL}-", check=False)
            cluster.kubectl("label", "node", cluster.node_name, f"{OWNED_LABEL}-", check=False)
            cluster.kubectl("label", "node", cluster.node_name, f"{MIG_STATE}-", check=False)
