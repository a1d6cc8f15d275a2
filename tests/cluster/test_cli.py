"""`kubectl gpushare` against the real API server: namespaces (-n, -A, the context's),
label selectors sent to the server (-l), -o yaml, get gpus and --watch, run as a user runs it
(a subprocess with the cluster's kubeconfig). Live readings are covered by
tests/cluster/test_exporter_prometheus.py."""

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.api.inventory import dump_inventory
from gpushare.api.names import ANN_NODE_GPUS
from gpushare.node.gpu.simulated import SimulatedBackend, simulated_uuid
from tests.fixtures.cluster import LocalCluster

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
TEAMS = ("gpushare-cli-a", "gpushare-cli-b")
# pod -> (namespace, labels, GPU indexes, fraction, thread %)
PODS: dict[str, tuple[str, dict[str, str], tuple[int, ...], str, int]] = {
    "train": (TEAMS[0], {"app": "train", "tier": "batch"}, (0,), "0.5", 50),
    "infer": (TEAMS[0], {"app": "infer", "tier": "online"}, (0,), "0.25", 40),
    "other": (TEAMS[1], {"app": "train", "tier": "batch"}, (0, 1), "2", 100),
}


def cli(
    cluster: LocalCluster, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpushare.cli.main", *args],
        env={**cluster.env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ok(cluster: LocalCluster, *args: str) -> str:
    proc = cli(cluster, *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _pod(name: str, cluster: LocalCluster) -> dict[str, Any]:
    namespace, labels, gpus, fraction, threads = PODS[name]
    uuids = ",".join(simulated_uuid(cluster.node_name, i) for i in gpus)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {
                "gpushare.io/gpu-fraction": fraction,
                "gpushare.io/gpu-uuid": uuids,
                "gpushare.io/active-thread-percentage": str(threads),
                "gpushare.io/bind-time": "2026-01-01T00:00:00.000000Z",
                "gpushare.io/state": "allocated",
            },
        },
        "spec": {
            "nodeName": cluster.node_name,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": cluster.busybox_image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "sleep 3600"],
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def placed(cluster: LocalCluster) -> Iterator[LocalCluster]:
    node = json.loads(cluster.kubectl("get", "node", cluster.node_name, "-o", "json"))
    added = ANN_NODE_GPUS not in (node["metadata"].get("annotations") or {})
    if added:  # no node agent published an inventory: publish a simulated one
        inventory = SimulatedBackend("2xH100-80GB", node_name=cluster.node_name).inventory()
        cluster.kubectl(
            "annotate", "node", cluster.node_name, f"{ANN_NODE_GPUS}={dump_inventory(inventory)}"
        )
    for team in TEAMS:
        cluster.kubectl("delete", "namespace", team, "--ignore-not-found", "--wait=true")
        cluster.kubectl("create", "namespace", team)
    try:
        for name in PODS:
            cluster.kubectl("apply", "-f", "-", input=json.dumps(_pod(name, cluster)))
        yield cluster
    finally:
        for team in TEAMS:
            cluster.remove_namespace(team)
        if added:
            cluster.kubectl("annotate", "node", cluster.node_name, f"{ANN_NODE_GPUS}-")


def names(document: str) -> list[str]:
    return sorted(i["name"] for i in yaml.safe_load(document)["items"])


def test_namespace_flags_choose_what_is_read(placed: LocalCluster) -> None:
    assert names(ok(placed, "get", "pods", "-n", TEAMS[0], "-o", "yaml")) == ["infer", "train"]
    everyone = names(ok(placed, "get", "pods", "-A", "-o", "yaml"))
    assert {"infer", "other", "train"} <= set(everyone)
    # Without -n: the context's namespace (the harness's kubeconfig names none: default).
    assert not set(names(ok(placed, "get", "pods", "-o", "yaml"))) & set(PODS)
    assert ok(placed, "get", "pods").splitlines()[0].split()[0] != "NAMESPACE"


def test_label_selectors_reach_the_api_server(placed: LocalCluster) -> None:
    both = ["-n", TEAMS[0]]
    trains = set(names(ok(placed, "get", "pods", "-A", "-l", "app=train", "-o", "yaml")))
    assert {"train", "other"} <= trains and "infer" not in trains
    assert names(ok(placed, "get", "pods", *both, "-l", "tier in (online)", "-o", "yaml")) == [
        "infer"
    ]
    assert names(ok(placed, "get", "pods", *both, "-l", "tier!=online", "-o", "yaml")) == ["train"]
    table = ok(placed, "top", "-n", TEAMS[0], "-l", "!missing,app")
    assert "train" in table and "infer" in table
    bad = cli(placed, "get", "pods", "-l", "tier in (a")
    assert bad.returncode == 1 and bad.stderr.startswith("error: -l/--selector:")


def test_get_gpus_counts_every_namespace_and_selects_nodes(placed: LocalCluster) -> None:
    host = f"kubernetes.io/hostname={placed.node_name}"
    gpus = yaml.safe_load(ok(placed, "get", "gpus", "-l", host, "-o", "yaml"))["items"]
    first = next(g for g in gpus if g["uuid"] == simulated_uuid(placed.node_name, 0))
    assert {f"{TEAMS[0]}/train", f"{TEAMS[0]}/infer", f"{TEAMS[1]}/other"} <= set(first["pods"])
    assert ok(placed, "get", "gpus", "-l", "no-such-label=x").startswith("No node advertises")
    wide = ok(placed, "get", "pods", "-A", "-o", "wide", "-l", "app=train")
    assert "GPU-UUID" in wide and simulated_uuid(placed.node_name, 1) in wide


def test_watch_prints_the_view_and_ends_at_its_timeout(placed: LocalCluster) -> None:
    proc = cli(
        placed, "get", "pods", "-n", TEAMS[1], "-o", "json", "-w", "--interval", "1",
        "--watch-timeout", "3", timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    first = json.JSONDecoder().raw_decode(proc.stdout)[0]
    assert [i["name"] for i in first["items"]] == ["other"]
