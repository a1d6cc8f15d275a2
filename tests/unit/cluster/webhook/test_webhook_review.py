"""The admission webhook: what it adds to a gpushare pod and what it refuses, with the field and
the fix in the message."""

import base64
import json
from typing import Any

import pytest

from gpushare.api.dra import ANN_DRA_GPU
from gpushare.api.names import (
    ANN_CLASS,
    ANN_CONTAINER,
    ANN_GPU_UUID,
    ANN_LIMIT,
    ANN_MEMORY,
    ANN_REQUEST_PERCENT,
    ANN_SHARE,
    ANN_TIER,
    RESOURCE_GPU_OPPORTUNISTIC,
    RESOURCE_GPU_PERCENT,
    SCHEDULER_NAME,
)
from gpushare.cluster.webhook.facts import ClusterFacts
from gpushare.cluster.webhook.registration import match_condition_expression
from gpushare.cluster.webhook.review import (
    BadReviewError,
    answer,
    parse_review,
    review,
)
from tests.fixtures.builders import apply_patch, pod_json, webhook_facts

FACTS = webhook_facts()


def mutated(pod: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    verdict = review(pod, namespace=namespace, facts=FACTS, mutate=True)
    assert verdict.allowed, verdict.message
    return apply_patch(pod, verdict.patch)


def refusal(pod: dict[str, Any], namespace: str = "default") -> str:
    verdict = review(pod, namespace=namespace, facts=FACTS, mutate=True)
    assert not verdict.allowed
    return verdict.message


def test_a_fraction_becomes_a_gpu_percent_limit_and_the_gpushare_scheduler() -> None:
    pod = mutated(pod_json("p", fraction="0.25"))
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["limits"][RESOURCE_GPU_PERCENT] == "25"
    assert resources["requests"][RESOURCE_GPU_PERCENT] == "25"
    assert pod["spec"]["schedulerName"] == SCHEDULER_NAME
    # ... and the mutated pod passes validation.
    assert review(pod, namespace="default", facts=FACTS, mutate=False).allowed


def test_the_named_container_gets_the_share_and_existing_limits_are_kept() -> None:
    containers = [
        {"name": "sidecar", "image": "busybox"},
        {"name": "trainer", "image": "busybox", "resources": {"limits": {"cpu": "2"}}},
    ]
    pod = mutated(
        pod_json("p", fraction="50%", annotations={ANN_CONTAINER: "trainer"}, containers=containers)
    )
    assert "resources" not in pod["spec"]["containers"][0]
    limits = pod["spec"]["containers"][1]["resources"]["limits"]
    assert limits == {"cpu": "2", RESOURCE_GPU_PERCENT: "50"}


def test_whole_gpus_become_multiples_of_100() -> None:
    pod = mutated(pod_json("p", fraction="2"))
    assert pod["spec"]["containers"][0]["resources"]["limits"][RESOURCE_GPU_PERCENT] == "200"


def test_a_gpushare_link_takes_the_share_fraction_memory_and_class() -> None:
    pod = mutated(pod_json("p", namespace="team", annotations={ANN_SHARE: "infer"}), "team")
    assert pod["spec"]["containers"][0]["resources"]["limits"][RESOURCE_GPU_PERCENT] == "30"
    assert pod["metadata"]["annotations"][ANN_MEMORY] == "12Gi"
    assert pod["metadata"]["annotations"][ANN_CLASS] == "latency"


@pytest.mark.parametrize(
    ("pod", "field", "fix"),
    [
        (pod_json("p", fraction="1.5"), "gpushare.io/gpu-fraction", "whole number"),
        (pod_json("p", fraction="zero"), "gpushare.io/gpu-fraction", 'like "0.25"'),
        (pod_json("p", fraction="0"), "gpushare.io/gpu-fraction", "0 < f <= 1"),
        (pod_json("p", fraction="0.255"), "gpushare.io/gpu-fraction", "whole percent"),
        (pod_json("p", fraction="16"), "gpushare.io/gpu-fraction", "at most 8 GPUs"),
        (
            pod_json("p", fraction="0.5", annotations={ANN_MEMORY: "100Gi"}),
            "gpushare.io/gpu-memory",
            "at most 80Gi",
        ),
        (
            pod_json("p", fraction="0.5", annotations={ANN_CLASS: "realtime"}),
            "gpushare.io/class",
            "latency, batch",
        ),
        (
            pod_json("p", fraction="0.5", annotations={ANN_CONTAINER: "nope"}),
            "gpushare.io/container",
            "main",
        ),
        (
            pod_json("p", annotations={ANN_SHARE: "missing"}),
            "gpushare.io/share",
            "create the GpuShare first",
        ),
        (
            pod_json("p", fraction="0.5", annotations={ANN_GPU_UUID: "GPU-1"}),
            "gpushare.io/gpu-uuid",
            "remove it",
        ),
        (
            pod_json("p", fraction="0.5", annotations={ANN_DRA_GPU: "GPU-1"}),
            "gpushare.io/dra-gpu",
            "remove it",
        ),
        (
            pod_json("p", fraction="0.5", annotations={ANN_REQUEST_PERCENT: "50"}),
            "gpushare.io/request-percentage",
            "remove it",
        ),
        (
            # A Binding's annotations merge into the pod's: a forged tier would outlive the
            # extender's guaranteed placement and keep the share out of the GPU's accounting.
            pod_json("p", fraction="0.5", annotations={ANN_TIER: "opportunistic"}),
            "gpushare.io/tier",
            "remove it",
        ),
        (
            pod_json("p", fraction="0.5", annotations={ANN_LIMIT: "0.3"}),
            "gpushare.io/gpu-limit",
            "at least 50%",
        ),
        (
            pod_json("p", fraction="0.5", annotations={ANN_LIMIT: "2"}),
            "gpushare.io/gpu-limit",
            'like "0.5" or "50%"',
        ),
        (
            pod_json("p", fraction="0.5", annotations={ANN_LIMIT: "9" * 4096}),
            "gpushare.io/gpu-limit",
            "or remove it",
        ),
        (
            pod_json("p", fraction="1", annotations={ANN_LIMIT: "0.5"}),
            "gpushare.io/gpu-limit",
            "never capped",
        ),
        (
            pod_json("p", namespace="team", annotations={ANN_SHARE: "infer", ANN_LIMIT: "20%"}),
            "gpushare.io/gpu-limit",
            "at least 30%",
        ),
        (
            pod_json("p", annotations={ANN_LIMIT: "0.5"}),
            "gpushare.io/gpu-limit",
            "add gpushare.io/gpu-fraction",
        ),
        (
            pod_json(
                "p",
                fraction="0.5",
                containers=[
                    {
                        "name": "m",
                        "image": "b",
                        "env": [{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/x"}],
                    }
                ],
            ),
            "spec.containers[0].env[0] (CUDA_MPS_PIPE_DIRECTORY)",
            "remove CUDA_MPS_PIPE_DIRECTORY",
        ),
        (
            pod_json(
                "p",
                fraction="0.5",
                containers=[
                    {"name": "m", "image": "b"},
                    {
                        "name": "s",
                        "image": "b",
                        "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}],
                    },
                ],
            ),
            "spec.containers[1].env[0] (CUDA_VISIBLE_DEVICES)",
            "remove CUDA_VISIBLE_DEVICES",
        ),
        (
            pod_json(
                "p",
                fraction="0.5",
                containers=[
                    {"name": "m", "image": "b", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                ],
            ),
            "spec.containers[0].resources[nvidia.com/gpu]",
            "remove nvidia.com/gpu",
        ),
        (
            pod_json(
                "p",
                fraction="0.5",
                extra_spec={
                    "volumes": [
                        {"name": "dp", "hostPath": {"path": "/var/lib/kubelet/device-plugins/"}}
                    ]
                },
            ),
            "spec.volumes[0].hostPath.path",
            "remove the hostPath volume",
        ),
        (
            pod_json(
                "p",
                fraction="0.5",
                extra_spec={"volumes": [{"name": "r", "hostPath": {"path": "/"}}]},
            ),
            "spec.volumes[0].hostPath.path",
            "remove the hostPath volume",
        ),
        (  # issue #45: the kubelet-plugin and CDI directories were missing from the list
            pod_json(
                "p",
                fraction="0.5",
                extra_spec={
                    "volumes": [
                        {"name": "r", "hostPath": {"path": "/var/lib/kubelet/plugins_registry"}}
                    ]
                },
            ),
            "spec.volumes[0].hostPath.path",
            "remove the hostPath volume",
        ),
        (  # issue #45: the kubelet-plugin and CDI directories were missing from the list
            pod_json(
                "p",
                fraction="0.5",
                extra_spec={
                    "volumes": [
                        {
                            "name": "r",
                            "hostPath": {"path": "/var/lib/kubelet/plugins/gpu.gpushare.io"},
                        }
                    ]
                },
            ),
            "spec.volumes[0].hostPath.path",
            "remove the hostPath volume",
        ),
        (  # issue #45: the kubelet-plugin and CDI directories were missing from the list
            pod_json(
                "p",
                fraction="0.5",
                extra_spec={"volumes": [{"name": "r", "hostPath": {"path": "/var/run/cdi"}}]},
            ),
            "spec.volumes[0].hostPath.path",
            "remove the hostPath volume",
        ),
        (  # issue #45: the kubelet-plugin and CDI directories were missing from the list
            pod_json(
                "p",
                fraction="0.5",
                extra_spec={"volumes": [{"name": "r", "hostPath": {"path": "/etc/cdi/"}}]},
            ),
            "spec.volumes[0].hostPath.path",
            "remove the hostPath volume",
        ),
        (
            pod_json("p", fraction="0.5", extra_spec={"schedulerName": "volcano"}),
            "spec.schedulerName",
            "remove spec.schedulerName",
        ),
        (
            pod_json(
                "p",
                fraction="0.5",
                containers=[
                    {
                        "name": "m",
                        "image": "b",
                        "resources": {"limits": {RESOURCE_GPU_PERCENT: "10"}},
                    }
                ],
            ),
            f"spec.containers[0].resources.limits[{RESOURCE_GPU_PERCENT}]",
            "remove it",
        ),
    ],
)
def test_refusals_name_the_field_and_the_fix(pod: dict[str, Any], field: str, fix: str) -> None:
    namespace = pod["metadata"].get("namespace", "default")
    message = refusal(pod, namespace)
    assert message.startswith(field) or f"; {field}" in message, message
    assert fix in message


def test_a_limit_at_or_above_the_request_is_accepted_and_kept() -> None:
    pod = mutated(pod_json("p", fraction="0.25", annotations={ANN_LIMIT: "60%"}))
    assert pod["metadata"]["annotations"][ANN_LIMIT] == "60%"
    assert pod["spec"]["containers"][0]["resources"]["limits"][RESOURCE_GPU_PERCENT] == "25"


def test_a_pod_asking_for_gpu_percent_directly_is_sent_to_the_gpushare_scheduler() -> None:
    containers = [
        {"name": "m", "image": "b", "resources": {"limits": {RESOURCE_GPU_PERCENT: "40"}}}
    ]
    pod = mutated(pod_json("p", containers=containers))
    assert pod["spec"]["schedulerName"] == SCHEDULER_NAME
    assert review(pod, namespace="default", facts=FACTS, mutate=False).allowed


def test_validation_refuses_a_gpushare_pod_that_skipped_the_mutating_webhook() -> None:
    verdict = review(pod_json("p", fraction="0.25"), namespace="default", facts=FACTS, mutate=False)
    assert not verdict.allowed
    assert f"spec.containers[0].resources.limits[{RESOURCE_GPU_PERCENT}]: is missing" in (
        verdict.message
    )
    assert "spec.schedulerName" in verdict.message


def test_other_pods_pass_untouched_even_with_reserved_env() -> None:
    pod = pod_json(
        "p", containers=[{"name": "m", "image": "b", "env": [{"name": "CUDA_VISIBLE_DEVICES"}]}]
    )
    verdict = review(pod, namespace="default", facts=FACTS, mutate=True)
    assert verdict.allowed and verdict.patch == []


def test_memory_check_is_skipped_before_any_inventory_is_known() -> None:
    pod = pod_json("p", fraction="0.5", annotations={ANN_MEMORY: "100Gi"})
    assert review(pod, namespace="default", facts=ClusterFacts(), mutate=True).allowed


def review_body(pod: dict[str, Any] | None, *, operation: str = "CREATE") -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "abc-123",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "operation": operation,
                "namespace": "default",
                "object": pod,
            },
        }
    ).encode()


def test_admission_review_response_carries_the_uid_and_a_base64_json_patch() -> None:
    doc, _ = answer(
        parse_review(review_body(pod_json("p", fraction="0.5"))), facts=FACTS, mutate=True
    )
    response = doc["response"]
    assert doc["apiVersion"] == "admission.k8s.io/v1" and doc["kind"] == "AdmissionReview"
    assert response["uid"] == "abc-123" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    assert {"op": "add", "path": "/spec/schedulerName", "value": SCHEDULER_NAME} in ops


def test_admission_review_refusal_is_a_403_with_the_message() -> None:
    doc, _ = answer(
        parse_review(review_body(pod_json("p", fraction="2.5"))), facts=FACTS, mutate=False
    )
    status = doc["response"]["status"]
    assert doc["response"]["allowed"] is False
    assert status["code"] == 403
    assert status["message"].startswith("gpushare: gpushare.io/gpu-fraction")


def test_only_pod_creation_is_reviewed() -> None:
    doc, _ = answer(
        parse_review(review_body(pod_json("p", fraction="2.5"), operation="UPDATE")),
        facts=FACTS,
        mutate=False,
    )
    assert doc["response"]["allowed"] is True


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "not JSON"),
        (b"[]", "AdmissionReview object"),
        (
            b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1beta1"}',
            "admissionReviewVersions",
        ),
        (
            b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {}}',
            "request.uid",
        ),
    ],
)
def test_malformed_reviews_are_rejected_with_the_reason(body: bytes, reason: str) -> None:
    with pytest.raises(BadReviewError, match=reason):
        parse_review(body)


# ---- accounting cannot be changed around the webhook ---------------------------------------


@pytest.mark.parametrize("annotated", [True, False])
def test_a_gpu_share_in_an_init_container_is_refused(annotated: bool) -> None:
    """The kubelet would Allocate slices to the init container that no placement counts."""
    init = {
        "name": "setup",
        "image": "busybox",
        "resources": {"limits": {RESOURCE_GPU_PERCENT: "50"}},
    }
    pod = pod_json(
        "p", fraction="0.1" if annotated else None, extra_spec={"initContainers": [init]}
    )
    verdict = review(pod, namespace="team", facts=FACTS, mutate=True)
    assert not verdict.allowed
    assert f"spec.initContainers[0].resources[{RESOURCE_GPU_PERCENT}]" in verdict.message
    assert "give the GPU share to one of spec.containers" in verdict.message


def test_the_api_server_sends_pods_whose_only_gpu_request_is_in_an_init_container() -> None:
    assert "object.spec.initContainers.exists" in match_condition_expression()


@pytest.mark.parametrize("resource", [RESOURCE_GPU_PERCENT, RESOURCE_GPU_OPPORTUNISTIC])
@pytest.mark.parametrize("part", ["limits", "requests"])
def test_the_api_server_sends_pods_asking_for_either_gpu_resource(resource: str, part: str) -> None:
    """#45: a pod asking for opportunistic-gpu-percent directly, with no gpushare annotation,
    was never sent (the security suite created one asking for two GPUs' worth)."""
    expression = match_condition_expression()
    clause = f"(has(c.resources.{part}) && '{resource}' in c.resources.{part})"
    assert expression.count(clause) == 2  # containers and init containers


@pytest.mark.parametrize("key", ["gpushare.io/profiling", "gpushare.io/profile"])
def test_operator_written_annotations_are_refused_at_creation(key: str) -> None:
    pod = pod_json("p", fraction="0.25", annotations={key: "true"})
    verdict = review(pod, namespace="team", facts=FACTS, mutate=True)
    assert not verdict.allowed
    assert key in verdict.message and "GpuShare" in verdict.message
