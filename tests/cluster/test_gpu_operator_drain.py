"""The GPU Operator upgrades the driver of a node gpushare shares (issue #66), driven on the
local cluster's node as the operator's components write its labels: the upgrade controller's
``nvidia.com/gpu-driver-upgrade-state`` (upgrade-required, cordon-required with the node
cordoned, wait-for-jobs-required, pod-deletion-required, drain-required, pod-restart-required,
validation-required, uncordon-required with the node uncordoned, upgrade-done) and the driver
manager's ``nvidia.com/gpu.deploy.client=paused-for-driver-upgrade`` while the driver pod
restarts. The chart runs with the node labelled ``nvidia.com/gpu.deploy.client=true`` and
``node.gpuOperatorClient=true``, as on a GPU Operator cluster.

What a user would notice: at pod-deletion-required every running gpushare pod on the node gets
a ``GpushareDrainedForGpuOperator`` Event and is evicted (a Deployment's pod comes back
Pending, a bare pod is gone); the node is marked not ready for gpushare and, once drained, no
gpushare pod and no node agent is left on it; after the upgrade the agent is back and Ready
and the Deployment's pod runs there again. A label value the agent does not know is logged
and ignored: the agent stays Ready. The MPS daemons are the simulated backend's (none run).
"""

import json
import uuid
from typing import Any

import pytest

from gpushare.api.gpu_operator import DEPLOY_CLIENT, UPGRADE_STATE
from gpushare.api.names import ANN_AGENT_READY, ANN_FRACTION
from gpushare.node.gpu_operator import REASON_DRAINED
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
    workload_pod,
)
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.helm_chart import CHART, LOCAL_VALUES

pytestmark = [pytest.mark.cluster, pytest.mark.whole_node]

Obj = dict[str, Any]


def agents(cluster: LocalCluster) -> list[Obj]:
    return [p for p in release_pods(cluster) if component(p) == "node-agent"]


def label(cluster: LocalCluster, key: str, value: str | None) -> None:
    arg = f"{key}-" if value is None else f"{key}={value}"
    cluster.kubectl("label", "node", cluster.node_name, arg, "--overwrite", check=value is not None)


def agent_ready(cluster: LocalCluster) -> str | None:
    node = kjson(cluster, "get", "node", cluster.node_name)
    return node["metadata"].get("annotations", {}).get(ANN_AGENT_READY)  # type: ignore[no-any-return]


def gpu_pods_on_node(cluster: LocalCluster, namespace: str) -> list[Obj]:
    pods = kjson(cluster, "get", "pods", "-n", namespace)["items"]
    return [
        p
        for p in pods
        if p["spec"].get("nodeName") == cluster.node_name
        and p["status"].get("phase") not in ("Succeeded", "Failed")
    ]


def deployment(cluster: LocalCluster) -> Obj:
    template = workload_pod(cluster, "ignored", "0.25")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "trainer"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "trainer"}},
            "template": {
                "metadata": {"labels": {"app": "trainer"}, "annotations": {ANN_FRACTION: "0.25"}},
                "spec": template["spec"],
            },
        },
    }


def test_a_driver_upgrade_drains_gpushare_off_the_node_and_it_comes_back(
    cluster: LocalCluster, images: None
) -> None:
    ns = f"gs-upgrade-{uuid.uuid4().hex[:6]}"
    with exclusive_node(cluster):
        remove_release(cluster)
        try:
            label(cluster, DEPLOY_CLIENT, "true")  # the GPU Operator labels its GPU nodes so
            helm(
                cluster, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                "--create-namespace", "--values", str(LOCAL_VALUES),
                "--set", "node.gpuOperatorClient=true", "--wait", "--timeout", "5m",
            )  # fmt: skip
            pods = wait_ready_release_pods(cluster, timeout_s=120)
            assert pods and all(ready(p) for p in pods)
            cluster.kubectl("create", "namespace", ns)
            cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(deployment(cluster)))
            bare = workload_pod(cluster, "bare", "0.5")
            cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(bare))
            running = wait_for(
                lambda: (
                    got
                    if len(got := gpu_pods_on_node(cluster, ns)) == 2
                    and all(p["status"].get("phase") == "Running" for p in got)
                    else None
                ),
                timeout_s=120,
                what="the Deployment's pod and the bare pod Running on the node",
            )
            names = {p["metadata"]["name"] for p in running}

            # A value nobody documented: logged, ignored, the agent stays Ready.
            label(cluster, UPGRADE_STATE, "banana")
            (agent,) = agents(cluster)
            wait_for(
                lambda: (
                    "banana"
                    in cluster.kubectl(
                        "logs", "-n", NAMESPACE, agent["metadata"]["name"], "-c", "agent"
                    )
                ),
                timeout_s=30,
                what="the agent's log line about the unknown value",
            )
            assert ready(kjson(cluster, "get", "pod", "-n", NAMESPACE, agent["metadata"]["name"]))
            assert agent_ready(cluster) == "true"

            # The upgrade controller's first states change nothing for running pods.
            for state in ("upgrade-required", "cordon-required", "wait-for-jobs-required"):
                label(cluster, UPGRADE_STATE, state)
                if state == "cordon-required":
                    cluster.kubectl("cordon", cluster.node_name)
            assert {p["metadata"]["name"] for p in gpu_pods_on_node(cluster, ns)} == names

            # It deletes the GPU pods it knows (none of gpushare's): gpushare drains its own.
            label(cluster, UPGRADE_STATE, "pod-deletion-required")
            wait_for(
                lambda: not gpu_pods_on_node(cluster, ns) and not agents(cluster),
                timeout_s=240,
                what="no gpushare pod and no node agent left on the node",
            )
            assert agent_ready(cluster) == "false"
            for name in names:
                events = cluster.events(ns, name=name, reason=REASON_DRAINED)
                assert events, f"pod {name} went without a {REASON_DRAINED} Event"
                assert "pod-deletion-required" in events[0]["message"]
            # The Deployment's new pod waits (the node is cordoned and not ready).
            pending = kjson(cluster, "get", "pods", "-n", ns, "-l", "app=trainer")["items"]
            assert [p["status"].get("phase") for p in pending] == ["Pending"]

            # The driver pod restarts: its manager pauses the GPU clients, then brings them
            # back; nothing of gpushare starts meanwhile.
            for state in ("drain-required", "pod-restart-required"):
                label(cluster, UPGRADE_STATE, state)
            label(cluster, DEPLOY_CLIENT, "paused-for-driver-upgrade")
            assert not agents(cluster) and not gpu_pods_on_node(cluster, ns)
            label(cluster, DEPLOY_CLIENT, "true")
            label(cluster, UPGRADE_STATE, "validation-required")
            wait_for(
                lambda: (a := agents(cluster)) and all(ready(p) for p in a),
                timeout_s=180,
                what="the node agent back and Ready on the new driver",
            )
            label(cluster, UPGRADE_STATE, "uncordon-required")
            cluster.kubectl("uncordon", cluster.node_name)
            label(cluster, UPGRADE_STATE, "upgrade-done")
            wait_for(
                lambda: [
                    p
                    for p in gpu_pods_on_node(cluster, ns)
                    if p["status"].get("phase") == "Running"
                ],
                timeout_s=180,
                what="the Deployment's pod Running on the node again",
            )
            assert agent_ready(cluster) == "true"
        finally:
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
            cluster.kubectl("uncordon", cluster.node_name, check=False)
            remove_release(cluster)
            label(cluster, UPGRADE_STATE, None)
            label(cluster, DEPLOY_CLIENT, None)
