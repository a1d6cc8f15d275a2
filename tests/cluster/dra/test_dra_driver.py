"""gpushare's DRA driver end to end on the DRA-mode local cluster: the node agent in
``--mode dra`` (simulated GPUs, a host process) publishes the node's ResourceSlice, kube-scheduler
allocates a claim of the chart's DeviceClass, the kubelet has the agent prepare it, and
containerd applies the agent's CDI spec: the container starts with its GPU and MPS limits.
"""

import json
import uuid
from typing import Any

import pytest

from tests.fixtures.chart_release import wait_for
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.dra import SHOW_ENV, container_env, release_pods

pytestmark = pytest.mark.cluster

Obj = dict[str, Any]


def test_agent_publishes_one_shareable_device_per_gpu(dra_agent: list[Obj]) -> None:
    devices = [d for s in dra_agent for d in s["spec"]["devices"]]
    assert sorted(d["name"] for d in devices) == ["gpu-0", "gpu-1"]
    for d in devices:
        assert d["allowMultipleAllocations"] is True  # the gate is on in the API server
        assert d["capacity"]["gpuPercent"]["value"] == "100"
        assert d["attributes"]["simulated"] == {"bool": True}


def test_a_claimed_share_starts_with_its_gpu_and_mps_limit(
    dra_cluster: LocalCluster, dra_agent: list[Obj], device_class: str
) -> None:
    c = dra_cluster
    ns = f"dra-e2e-{uuid.uuid4().hex[:6]}"
    c.kubectl("create", "namespace", ns)
    try:
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "share"},
            "spec": {"devices": {
                "requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": device_class,
                    "capacity": {"requests": {"gpuPercent": "30"}},
                }}],
                "config": [{"requests": ["gpu"], "opaque": {"driver": "gpu.gpushare.io",
                    "parameters": {"apiVersion": "gpushare.io/v1alpha1", "kind": "MpsConfig",
                                   "limit": 45}}}],
            }},
        }  # fmt: skip
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "job"},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "share"}],
                "containers": [{
                    "name": "main", "image": c.busybox_image, "imagePullPolicy": "Never",
                    "command": ["sh", "-c", SHOW_ENV],
                    "resources": {"claims": [{"name": "gpu"}]},
                }],
            },
        }  # fmt: skip
        # The claim first, then its pod (a pod kube-scheduler saw before its claim waits for
        # its next flush of unschedulable pods). dra_agent waited for the kubelet to register
        # the driver: a pod bound before that would wait for its next resync.
        for item in (claim, pod):
            c.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(item))

        def running() -> bool:
            p = json.loads(c.kubectl("get", "pod", "job", "-n", ns, "-o", "json"))
            return bool(p["status"].get("phase") == "Running")

        try:
            wait_for(running, timeout_s=90, what="the pod Running", every_s=0.5)
        except AssertionError:
            events = c.kubectl("get", "events", "-n", ns)
            raise AssertionError(f"pod not Running:\n{events}") from None
        result = json.loads(c.kubectl("get", "resourceclaim", "share", "-n", ns, "-o", "json"))
        (r,) = result["status"]["allocation"]["devices"]["results"]
        device = next(
            d for s in dra_agent for d in s["spec"]["devices"] if d["name"] == r["device"]
        )
        env = container_env(c, ns, "job")  # printed after the MPS pipe directory was found
        assert env["CUDA_VISIBLE_DEVICES"] == device["attributes"]["uuid"]["string"]
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "45"  # the claim's limit
    finally:
        release_pods(c, ns)
        c.kubectl("delete", "namespace", ns, "--wait=false", check=False)
