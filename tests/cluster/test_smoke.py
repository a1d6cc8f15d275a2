"""The local cluster is real: the stock scheduler places a pod and the real kubelet runs it."""

import json
import time
import uuid

import pytest

from tests.fixtures.chart_release import wait_crds_established
from tests.fixtures.cluster import REPO, LocalCluster
from tests.fixtures.controller import ControllerProcess

pytestmark = pytest.mark.cluster


def _wait_for_phase(cluster: LocalCluster, name: str, phase: str, timeout_s: float) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout_s
    pod: dict = {}  # type: ignore[type-arg]
    while time.monotonic() < deadline:
        pod = json.loads(cluster.kubectl("get", "pod", name, "-o", "json"))
        if pod["status"].get("phase") == phase:
            return pod
        time.sleep(0.5)
    events = cluster.kubectl("get", "events", "--field-selector", f"involvedObject.name={name}")
    raise AssertionError(
        f"pod {name} not {phase} after {timeout_s}s: {pod.get('status')}\n{events}"
    )


def _reporter(event: dict) -> str:  # type: ignore[type-arg]
    return str(event.get("reportingComponent") or event.get("source", {}).get("component", ""))


def test_pod_is_scheduled_by_kube_scheduler_and_run_by_kubelet(cluster: LocalCluster) -> None:
    name = f"smoke-{uuid.uuid4().hex[:6]}"
    token = uuid.uuid4().hex
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": cluster.busybox_image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", f"echo ran-{token}; sleep 3600"],
                }
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    try:
        pod = _wait_for_phase(cluster, name, "Running", 90)
        assert pod["spec"]["nodeName"] == cluster.node_name
        scheduled = json.loads(
            cluster.kubectl(
                "get",
                "events",
                "-o",
                "json",
                "--field-selector",
                f"involvedObject.name={name},reason=Scheduled",
            )
        )["items"]
        assert scheduled, "no Scheduled event: the pod was not placed by a scheduler"
        assert _reporter(scheduled[0]) == "default-scheduler"
        # The container's own output proves the kubelet ran it through containerd.
        deadline = time.monotonic() + 30
        logs = ""
        while time.monotonic() < deadline and f"ran-{token}" not in logs:
            logs = cluster.kubectl("logs", name, check=False)
            time.sleep(0.5)
        assert f"ran-{token}" in logs
        assert pod["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
    finally:
        cluster.kubectl("delete", "pod", name, "--wait=false", check=False)


def test_gpushare_scheduler_profile_is_running(
    cluster: LocalCluster, controller: ControllerProcess
) -> None:
    """The second scheduler answers for schedulerName gpushare-scheduler: a pod asking for it
    (and no GPU) is placed by it, not by the default scheduler. It calls the gpushare extender
    for every pod of its profile, so the controller must be up (the ``controller`` fixture)."""
    name = f"gs-{uuid.uuid4().hex[:6]}"
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "gpushare-scheduler",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": cluster.busybox_image,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                }
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    try:
        _wait_for_phase(cluster, name, "Running", 90)
        events = json.loads(
            cluster.kubectl(
                "get",
                "events",
                "-o",
                "json",
                "--field-selector",
                f"involvedObject.name={name},reason=Scheduled",
            )
        )["items"]
        assert events and _reporter(events[0]) == "gpushare-scheduler"
    finally:
        cluster.kubectl("delete", "pod", name, "--wait=false", check=False)


def test_crds_apply_cleanly(cluster: LocalCluster) -> None:
    crds = sorted((REPO / "crds").glob("*.yaml"))
    if not crds:
        pytest.skip("no CRDs in crds/ yet")
    for crd in crds:
        out = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        assert "serverside-applied" in out or "configured" in out or "created" in out
    wait_crds_established(cluster)
