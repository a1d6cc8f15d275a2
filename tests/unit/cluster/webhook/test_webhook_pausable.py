"""An opportunistic pod is paused, not evicted, when a guaranteed pod needs the GPU (issue 65):
the webhook refuses an opted-in pod whose liveness or startup probe a pause would fail (the
kubelet would restart the container and its work would be lost), naming the field and the
fix; the cluster's default leaves such a pod guaranteed instead. A pod may not be created
carrying the pause annotations gpushare writes."""

from dataclasses import replace
from typing import Any

import pytest

from gpushare.api.names import (
    ANN_OPPORTUNISTIC,
    ANN_PAUSE,
    ANN_PAUSED,
    RESOURCE_GPU_OPPORTUNISTIC,
    RESOURCE_GPU_PERCENT,
)
from gpushare.api.pause import PauseRequest
from gpushare.cluster.webhook.review import review
from tests.fixtures.builders import apply_patch, pod_json, webhook_facts

FACTS = replace(webhook_facts(), opportunistic_placement=True)
DEFAULT_ON = replace(FACTS, opportunistic_default=True)
HTTP = {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 5}


def pod(*, opted: bool | None = True, **container: Any) -> dict[str, Any]:
    annotations = {} if opted is None else {ANN_OPPORTUNISTIC: "true" if opted else "false"}
    manifest = pod_json("p", fraction="0.3", annotations=annotations)
    manifest["spec"]["containers"][0].update(container)
    return manifest


@pytest.mark.parametrize(
    ("probe", "handler"),
    [
        ("livenessProbe", "httpGet"),
        ("livenessProbe", "grpc"),
        ("startupProbe", "httpGet"),
    ],
)
def test_an_opted_in_pod_with_a_probe_a_pause_would_fail_is_refused_naming_it(
    probe: str, handler: str
) -> None:
    spec = {handler: {"port": 8080}, "periodSeconds": 5}
    verdict = review(pod(**{probe: spec}), namespace="default", facts=FACTS, mutate=True)
    assert not verdict.allowed
    assert f"spec.containers[0].{probe}.{handler}" in verdict.message
    assert "paused" in verdict.message and "restart" in verdict.message
    assert "use an exec or tcpSocket" in verdict.message  # the fix


def test_a_sidecars_probe_counts_and_a_finished_init_containers_does_not() -> None:
    manifest = pod()
    manifest["spec"]["initContainers"] = [
        {"name": "setup", "image": "busybox", "livenessProbe": HTTP},  # done before the pod runs
        {"name": "proxy", "image": "busybox", "restartPolicy": "Always", "livenessProbe": HTTP},
    ]
    verdict = review(manifest, namespace="default", facts=FACTS, mutate=True)
    assert not verdict.allowed
    assert "spec.initContainers[1].livenessProbe.httpGet" in verdict.message
    assert "initContainers[0]" not in verdict.message


@pytest.mark.parametrize(
    "container",
    [
        {"livenessProbe": {"exec": {"command": ["true"]}}},
        {"livenessProbe": {"tcpSocket": {"port": 8080}}},
        {"readinessProbe": HTTP},  # a paused pod reads not ready; nothing restarts it
        {"startupProbe": {"exec": {"command": ["true"]}}},
    ],
)
def test_probes_a_pause_cannot_turn_into_a_restart_are_admitted(container: dict[str, Any]) -> None:
    verdict = review(pod(**container), namespace="default", facts=FACTS, mutate=True)
    assert verdict.allowed, verdict.message
    out = apply_patch(pod(**container), verdict.patch)
    limits = out["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {RESOURCE_GPU_OPPORTUNISTIC: "30"}


def test_a_guaranteed_pod_keeps_its_http_liveness_probe() -> None:
    for opted, facts in ((False, FACTS), (None, FACTS)):
        manifest = pod(opted=opted, livenessProbe=HTTP)
        verdict = review(manifest, namespace="default", facts=facts, mutate=True)
        assert verdict.allowed, verdict.message


def test_the_cluster_default_leaves_a_pod_that_cannot_be_paused_guaranteed() -> None:
    manifest = pod(opted=None, livenessProbe=HTTP)
    verdict = review(manifest, namespace="default", facts=DEFAULT_ON, mutate=True)
    assert verdict.allowed, verdict.message
    out = apply_patch(manifest, verdict.patch)
    assert out["spec"]["containers"][0]["resources"]["limits"] == {RESOURCE_GPU_PERCENT: "30"}
    assert ANN_OPPORTUNISTIC not in out["metadata"]["annotations"]
    check = review(out, namespace="default", facts=DEFAULT_ON, mutate=False)
    assert check.allowed, check.message


@pytest.mark.parametrize("key", [ANN_PAUSE, ANN_PAUSED])
def test_a_pod_cannot_be_created_paused(key: str) -> None:
    request = PauseRequest(reason="harm", message="x", since="2026-11-27T10:00:00Z").dump()
    manifest = pod_json("p", fraction="0.3", annotations={key: request})
    verdict = review(manifest, namespace="default", facts=FACTS, mutate=True)
    assert not verdict.allowed
    assert key in verdict.message and "written by gpushare when it pauses" in verdict.message
