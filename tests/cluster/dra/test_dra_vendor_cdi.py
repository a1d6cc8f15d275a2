"""A CDI node, as the GPU Operator >= v25.10 makes one (issue #66): the container toolkit has
written a CDI spec of kind ``nvidia.com/gpu`` naming each GPU by its UUID, and containerd
injects a GPU's device nodes and driver libraries only for a container that names that CDI
device. The agent (``--vendor-cdi auto``, the default) reads the spec and hands the kubelet the
GPU's NVIDIA device beside the claim's own; containerd (2.x, CDI on: the DRA-mode local
cluster) applies both.

The stand-in spec is written to /etc/cdi, where containerd and the agent read specs; what
the real spec adds (device nodes, libraries) stands here as one environment variable per GPU,
which the container prints.
"""

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.chart_release import wait_for
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.dra import release_pods, write_standin_nvidia_spec

pytestmark = pytest.mark.cluster

Obj = dict[str, Any]
SPEC = Path("/etc/cdi/gpushare-test-nvidia-standin.yaml")
SHOW = 'env | grep -E "^(CUDA_VISIBLE_DEVICES|STANDIN_NVIDIA_GPU)=" | sort; echo done; sleep 3600'


@pytest.fixture
def toolkit_spec(dra_agent: list[Obj]) -> Iterator[dict[str, str]]:
    """The stand-in NVIDIA spec for the node's GPUs; GPU UUID -> what it injects."""
    uuids = [d["attributes"]["uuid"]["string"] for s in dra_agent for d in s["spec"]["devices"]]
    marks = write_standin_nvidia_spec(SPEC, uuids, "injected")
    try:
        yield marks
    finally:
        SPEC.unlink(missing_ok=True)


def test_a_claimed_share_gets_its_gpus_nvidia_cdi_device_on_a_cdi_node(
    dra_cluster: LocalCluster, device_class: str, toolkit_spec: dict[str, str]
) -> None:
    c = dra_cluster
    ns = f"dra-cdi-{uuid.uuid4().hex[:6]}"
    c.kubectl("create", "namespace", ns)
    try:
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "share"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": device_class,
                "capacity": {"requests": {"gpuPercent": "20"}},
            }}]}},
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
                    "command": ["sh", "-c", SHOW], "resources": {"claims": [{"name": "gpu"}]},
                }],
            },
        }  # fmt: skip
        for item in (claim, pod):
            c.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(item))

        def printed() -> str:
            out = c.kubectl("logs", "job", "-n", ns, check=False)
            return out if "done" in out else ""

        try:
            logs = wait_for(printed, timeout_s=90, what="the pod's output", every_s=0.5)
        except AssertionError:
            raise AssertionError(c.kubectl("get", "events", "-n", ns)) from None
        env = dict(line.split("=", 1) for line in logs.splitlines() if "=" in line)
        gpu = env["CUDA_VISIBLE_DEVICES"]
        # containerd applied the NVIDIA device of the claim's own GPU, named by the agent.
        assert env.get("STANDIN_NVIDIA_GPU") == toolkit_spec[gpu], env
    finally:
        release_pods(c, ns)
        c.kubectl("delete", "namespace", ns, "--wait=false", check=False)
