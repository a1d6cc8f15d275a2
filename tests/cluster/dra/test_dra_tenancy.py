"""The tenancy boundary between claims of different namespaces, on the DRA-mode local cluster.

kube-scheduler's allocator knows nothing of gpushare's tenancy rule, so here it puts a claim of
a second namespace on the GPU that already serves a first namespace's claim (both claims select
gpu-0). The node agent refuses to prepare it: that pod waits, with the reason and the fix in its
events, while the first pod keeps running. When an admin puts both namespaces in one sharing
group, the kubelet's next try prepares it and the pod starts (docs/dra.md, "Tenancy").
"""

import json
import uuid
from collections.abc import Iterator

import pytest

from gpushare.api.names import LABEL_SHARING_GROUP
from tests.fixtures.chart_release import wait_for
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.dra import release_pods, share_claim, show_env_pod

pytestmark = pytest.mark.cluster

Obj = dict[str, object]
ON_GPU_0 = 'device.attributes["gpu.gpushare.io"].index == 0'


@pytest.fixture
def namespaces(dra_cluster: LocalCluster) -> Iterator[tuple[str, str]]:
    suffix = uuid.uuid4().hex[:6]
    names = (f"team-a-{suffix}", f"team-b-{suffix}")
    for ns in names:
        dra_cluster.kubectl("create", "namespace", ns)
    yield names
    for ns in names:
        release_pods(dra_cluster, ns)
        dra_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def phase(c: LocalCluster, ns: str) -> str:
    pod = json.loads(c.kubectl("get", "pod", "job", "-n", ns, "-o", "json"))
    return str(pod["status"].get("phase"))


def test_a_claim_of_another_namespace_waits_off_a_shared_gpu_until_grouped(
    dra_cluster: LocalCluster,
    dra_agent: list[Obj],
    device_class: str,
    namespaces: tuple[str, str],
) -> None:
    c = dra_cluster
    a, b = namespaces
    for ns in (a, b):
        # The claim before its pod: a pod kube-scheduler sees before its claim waits for the
        # scheduler's next flush of unschedulable pods (tests/cluster/dra/test_dra_driver.py).
        for item in (
            share_claim("share", device_class, {"gpuPercent": "20"}, selector=ON_GPU_0),
            show_env_pod("job", c.busybox_image, "share"),
        ):
            c.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(item))
        if ns == a:
            wait_for(lambda: phase(c, a) == "Running", timeout_s=90, what=f"{a}/job Running")

    def refusal() -> str:
        for event in c.events(b, name="job", reason="FailedPrepareDynamicResources"):
            message = str(event.get("message", ""))
            if "tenancy" in message:
                return message
        return ""

    message = wait_for(refusal, timeout_s=90, what=f"{b}/job refused for tenancy", every_s=1.0)
    assert f"{a}/share" in message and "sharing-group" in message, message
    assert phase(c, b) == "Pending"
    assert phase(c, a) == "Running"  # nothing placed is lost
    for ns in (a, b):
        c.kubectl("label", "namespace", ns, f"{LABEL_SHARING_GROUP}=ml", "--overwrite")
    wait_for(
        lambda: phase(c, b) == "Running",
        timeout_s=120,  # the pod's next resync (syncFrequency 10 s here, 60-90 s by default)
        what=f"{b}/job Running once both namespaces share a group",
        every_s=1.0,
    )
    assert phase(c, a) == "Running"
