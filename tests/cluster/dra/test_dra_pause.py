"""Pausing a DRA-mode pod (issue 65): the node agent in ``--mode dra`` pauses a pod holding a
claim it prepared, as it pauses an annotated pod in device-plugin mode
(tests/cluster/test_pause_cluster.py): the counter stops, ``gpushare.io/paused`` and a
``Paused`` Event appear; withdrawn, it goes on where it stopped with 0 restarts."""

import json
import uuid
from typing import Any

import pytest

from tests.cluster.test_pause_cluster import (
    COUNTER,
    ask_pause,
    counted,
    event_messages,
    get_pod,
    last,
    paused_record,
    restarts,
    still,
    withdraw,
)
from tests.fixtures.chart_release import wait_for
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.dra import release_pods, share_claim

pytestmark = pytest.mark.cluster


def test_a_dra_pod_is_paused_and_resumed_where_it_stopped(
    dra_cluster: LocalCluster, dra_agent: list[dict[str, Any]], device_class: str
) -> None:
    c = dra_cluster
    ns = f"dra-pause-{uuid.uuid4().hex[:6]}"
    c.kubectl("create", "namespace", ns)
    try:
        claim = share_claim("share", device_class, {"gpuPercent": "20"})
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "count"},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "share"}],
                "containers": [
                    {
                        "name": "main",
                        "image": c.busybox_image,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", COUNTER],
                        "resources": {"claims": [{"name": "gpu"}]},
                        "livenessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 2},
                    }
                ],
            },
        }
        for item in (claim, pod):
            c.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(item))
        wait_for(lambda: last(c, ns, "count") >= 5, timeout_s=120, what="the pod to count")

        ask_pause(c, ns, "count")
        wait_for(
            lambda: paused_record(c, ns, "count"),
            timeout_s=30,
            what="gpushare.io/paused",
            every_s=0.2,
        )
        assert wait_for(
            lambda: event_messages(c, ns, "count", "Paused"), timeout_s=30, what="Paused"
        )
        before, after = still(c, ns, "count", 8)
        assert after == before, f"the counter went on while paused: {before} -> {after}"

        withdraw(c, ns, "count")
        wait_for(
            lambda: last(c, ns, "count") > after + 5, timeout_s=30, what="the counter to go on"
        )
        numbers = counted(c, ns, "count")
        assert numbers == list(range(1, len(numbers) + 1)), "the counter started again"
        assert paused_record(c, ns, "count") is None
        assert restarts(get_pod(c, ns, "count")) == 0
    finally:
        release_pods(c, ns)
        c.kubectl("delete", "namespace", ns, "--wait=false", check=False)
