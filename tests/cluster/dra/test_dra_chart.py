"""`helm install --set mode=dra` on the DRA-mode local cluster, as a user installs it: the
chart's node agent publishes the node's GPUs as a ResourceSlice, the chart's controller turns
an annotated pod into a claim, kube-scheduler allocates it, the chart's agent prepares it, and
the container starts with its GPU and MPS settings; uninstall leaves nothing of the release.
"""

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gpushare.api.names import ANN_FRACTION, ANN_LIMIT
from tests.fixtures.chart_release import (
    NAMESPACE,
    RELEASE,
    check_nothing_left,
    component,
    diagnostics,
    exclusive_node,
    helm,
    kjson,
    remove_release,
    wait_for,
    wait_ready_release_pods,
    wait_webhook_serving,
)
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.dra import SHOW_ENV, container_env, node_slices
from tests.fixtures.helm_chart import CHART, LOCAL_VALUES

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[3]

DRA_PLUGIN_DIR = Path("/var/lib/kubelet/plugins/gpu.gpushare.io")
"""Where the local cluster's kubelet dials the chart agent (kubeletRoot /var/lib/kubelet)."""
CDI_DIR = Path("/var/run/cdi")
"""The chart's default ``dra.cdiDir``, one of the local containerd's cdi_spec_dirs."""


def gpushare_cli(c: LocalCluster, *args: str) -> str:
    """``kubectl gpushare ARGS`` with the cluster's kubeconfig; its output."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpushare.cli.main", *args],
        env={**c.env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_install_in_dra_mode_and_run_an_annotated_pod(
    dra_cluster: LocalCluster, images: None
) -> None:
    c = dra_cluster
    work = f"gpushare-dra-work-{uuid.uuid4().hex[:6]}"
    with exclusive_node(c):
        remove_release(c)
        try:
            helm(
                c, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                "--create-namespace", "--values", str(LOCAL_VALUES), "--set", "mode=dra",
                "--wait", "--timeout", "5m",
            )  # fmt: skip
            pods = wait_ready_release_pods(c, timeout_s=120)
            assert sorted(component(p) for p in pods) == [
                "controller", "controller", "node-agent", "scheduler",
            ]  # fmt: skip
            slices = wait_for(
                lambda: node_slices(c), timeout_s=60, what="the chart agent's ResourceSlice"
            )
            devices = {d["name"]: d for s in slices for d in s["spec"]["devices"]}
            assert sorted(devices) == ["gpu-0", "gpu-1"]
            wait_webhook_serving(c)

            c.kubectl("create", "namespace", work)
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "job",
                    "annotations": {ANN_FRACTION: "0.25", ANN_LIMIT: "0.5"},
                },
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "main", "image": c.busybox_image, "imagePullPolicy": "Never",
                        "command": ["sh", "-c", SHOW_ENV],
                    }],
                },
            }  # fmt: skip
            c.kubectl("create", "-n", work, "-f", "-", input=json.dumps(pod))
            wait_for(
                lambda: (
                    kjson(c, "get", "pod", "job", "-n", work)["status"].get("phase") == "Running"
                ),
                timeout_s=120,
                what="the annotated pod Running",
            )
            live = kjson(c, "get", "pod", "job", "-n", work)
            (status,) = live["status"]["resourceClaimStatuses"]
            claim = kjson(c, "get", "resourceclaim", status["resourceClaimName"], "-n", work)
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert result["consumedCapacity"]["gpuPercent"] == "25"
            env = container_env(c, work, "job")
            uuid_ = devices[result["device"]]["attributes"]["uuid"]["string"]
            assert env["CUDA_VISIBLE_DEVICES"] == uuid_
            assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
            # kubectl gpushare lists the pod under its GPU from the claim it holds.
            listed = json.loads(gpushare_cli(c, "get", "pods", "-n", work, "-o", "json"))
            (row,) = listed["items"]
            assert (row["name"], row["request_percent"], row["limit_percent"]) == ("job", 25, 50)
            assert row["state"] == "claim" and row["gpus"][0]["uuid"] == uuid_

            c.remove_namespace(work)
            helm(c, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "5m")
            check_nothing_left(c)
            # The agent's preStop emptied its kubelet plugin directory (socket, checkpoint)
            # and no claim's CDI spec is left for the runtime.
            assert not sorted(DRA_PLUGIN_DIR.glob("*")), sorted(DRA_PLUGIN_DIR.glob("*"))
            assert not sorted(CDI_DIR.glob("gpushare.io-gpu_claim-*.json"))
        except BaseException:
            print(diagnostics(c))
            raise
        finally:
            c.kubectl(
                "delete", "namespace", work, "--wait=false", "--ignore-not-found", check=False
            )
            remove_release(c)
