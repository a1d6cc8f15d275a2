"""The webhook in DRA mode (``--annotation-mode=dra``): an annotated pod gets a ResourceClaim
from a template named for its request, which the node agent's DRA driver can read, instead of
the gpu-percent resource; hostile templates and claim names are refused with the fix. The
template a name stands for is what the controller makes once the pod is stored
(gpushare.cluster.dra.templates, tests/unit/cluster/dra/test_claim_templates.py)."""

import json
from dataclasses import replace
from typing import Any

import pytest

from gpushare.api.dra import (
    CAPACITY_GPU_PERCENT,
    DRIVER,
    PLACEMENT_GATE,
    POD_CLAIM,
    parse_mps_config,
)
from gpushare.api.names import (
    ANN_CLASS,
    ANN_EXCLUSIVE,
    ANN_FRACTION,
    ANN_LIMIT,
    ANN_MEMORY,
    ANN_SHARE,
    RESOURCE_GPU_PERCENT,
)
from gpushare.cluster.dra.templates import ClaimTemplates
from gpushare.cluster.state import pod_facts, pods
from gpushare.cluster.webhook.review import answer, parse_review, review
from tests.fixtures.builders import apply_patch, pod_json, webhook_facts

FACTS = webhook_facts(dra_device_class="mps.gpushare.io")


def template_of(pod: dict[str, Any], namespace: str = "team") -> dict[str, Any]:
    """The template the controller makes for a stored pod: the one its claim's name stands
    for."""
    (entry,) = [c for c in pod["spec"]["resourceClaims"] if c["name"] == POD_CLAIM]
    made = ClaimTemplates(device_class="mps.gpushare.io").wanted(
        namespace, entry["resourceClaimTemplateName"]
    )
    assert made is not None, entry
    return made


def admitted(pod: dict[str, Any], namespace: str = "team") -> tuple[dict[str, Any], Any]:
    """The pod as the API server stores it (mutated, then validated), and its template."""
    verdict = review(pod, namespace=namespace, facts=FACTS, mutate=True)
    assert verdict.allowed, verdict.message
    out = apply_patch(pod, verdict.patch)
    checked = review(out, namespace=namespace, facts=FACTS, mutate=False)
    assert checked.allowed, checked.message
    return out, template_of(out, namespace)


def test_a_fraction_becomes_a_claim_from_a_template_of_that_share() -> None:
    pod, template = admitted(
        pod_json("p", fraction="0.3", annotations={ANN_MEMORY: "4Gi", ANN_CLASS: "latency"})
    )
    assert pod["spec"]["resourceClaims"] == [
        {"name": POD_CLAIM, "resourceClaimTemplateName": "gpushare-30pct-4gi-latency"}
    ]
    assert pod["spec"]["containers"][0]["resources"] == {"claims": [{"name": POD_CLAIM}]}
    assert "schedulerName" not in pod["spec"]  # kube-scheduler's DRA allocator places it
    assert RESOURCE_GPU_PERCENT not in json.dumps(pod)
    assert template["metadata"] == {
        "name": "gpushare-30pct-4gi-latency",
        "namespace": "team",
        "labels": {"app.kubernetes.io/managed-by": "gpushare"},
    }
    devices = template["spec"]["spec"]["devices"]
    (request,) = devices["requests"]
    assert request["exactly"] == {
        "deviceClassName": "mps.gpushare.io",
        "capacity": {"requests": {CAPACITY_GPU_PERCENT: "30", "memory": "4Gi"}},
    }
    (config,) = devices["config"]
    assert config["requests"] == [request["name"]]
    assert config["opaque"]["driver"] == DRIVER
    # What the node agent reads from the claim: the class (MPS priority), no limit.
    mps = parse_mps_config(config["opaque"]["parameters"], field="parameters")
    assert (mps.gpu_class, mps.limit) == ("latency", None)


def test_the_same_request_names_the_same_template_and_a_limit_reaches_the_driver() -> None:
    _, a = admitted(pod_json("a", fraction="0.25", annotations={ANN_LIMIT: "0.6"}))
    _, b = admitted(pod_json("b", fraction="0.25", annotations={ANN_LIMIT: "0.6"}))
    assert a == b and a["metadata"]["name"] == "gpushare-25pct-limit60"
    params = a["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert parse_mps_config(params, field="parameters").limit == 60
    _, other = admitted(pod_json("c", fraction="0.5"))
    assert other["metadata"]["name"] == "gpushare-50pct"


def test_whole_gpus_are_that_many_whole_devices() -> None:
    _, template = admitted(pod_json("p", fraction="2"))
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert template["metadata"]["name"] == "gpushare-200pct"
    assert request["exactly"]["count"] == 2
    assert request["exactly"]["capacity"] == {"requests": {CAPACITY_GPU_PERCENT: "100"}}


def test_a_gpushare_link_takes_the_share_fraction_memory_and_class() -> None:
    _, template = admitted(pod_json("p", annotations={ANN_SHARE: "infer"}))
    assert template["metadata"]["name"] == "gpushare-30pct-12gi-latency"


def test_an_exclusive_workload_gets_a_whole_gpu_template_that_validation_agrees_with() -> None:
    facts = replace(
        FACTS, exclusive_lookup=lambda uid, _ns: "3 GPU faults" if uid == "rs" else None
    )
    pod = pod_json("p", fraction="0.25")
    pod["metadata"]["ownerReferences"] = [{"controller": True, "uid": "rs", "kind": "ReplicaSet"}]
    verdict = review(pod, namespace="team", facts=facts, mutate=True)
    assert verdict.allowed
    assert "a whole GPU" in verdict.warnings[0]
    out = apply_patch(pod, verdict.patch)
    assert template_of(out)["metadata"]["name"] == "gpushare-100pct"
    assert out["metadata"]["annotations"][ANN_FRACTION] == "1"
    assert out["metadata"]["annotations"][ANN_EXCLUSIVE] == "3 GPU faults"
    assert review(out, namespace="team", facts=facts, mutate=False).allowed


def test_mutating_again_adds_nothing_and_keeps_the_users_own_claims() -> None:
    mine = {"name": "scratch", "resourceClaimName": "my-claim"}
    pod = pod_json(
        "p",
        fraction="0.5",
        extra_spec={"resourceClaims": [mine]},
        containers=[{"name": "main", "image": "x", "resources": {"claims": [{"name": "scratch"}]}}],
    )
    once, _ = admitted(pod)
    assert once["spec"]["resourceClaims"][0] == mine
    assert once["spec"]["containers"][0]["resources"]["claims"] == [
        {"name": "scratch"},
        {"name": POD_CLAIM},
    ]
    again = review(once, namespace="team", facts=FACTS, mutate=True)  # reinvocation
    assert again.allowed and again.patch == []


@pytest.mark.parametrize(
    ("pod", "field", "fix"),
    [
        (
            pod_json(
                "p",
                fraction="0.5",
                extra_spec={
                    "resourceClaims": [{"name": POD_CLAIM, "resourceClaimTemplateName": "huge"}]
                },
            ),
            "spec.resourceClaims[0]",
            "rename the claim",
        ),
        (
            pod_json(
                "p",
                fraction="0.5",
                containers=[
                    {
                        "name": "main",
                        "image": "x",
                        "resources": {"limits": {RESOURCE_GPU_PERCENT: "50"}},
                    }
                ],
            ),
            RESOURCE_GPU_PERCENT,
            "drop the",
        ),
    ],
)
def test_hostile_claims_and_mixed_requests_are_refused(
    pod: dict[str, Any], field: str, fix: str
) -> None:
    verdict = review(pod, namespace="team", facts=FACTS, mutate=True)
    assert not verdict.allowed
    assert verdict.message.startswith(field) and fix in verdict.message


def test_validation_refuses_an_annotated_pod_without_its_claim() -> None:
    verdict = review(pod_json("p", fraction="0.5"), namespace="team", facts=FACTS, mutate=False)
    assert not verdict.allowed
    assert "spec.resourceClaims" in verdict.message and "mutating webhook" in verdict.message


def test_the_view_leaves_a_claimed_pod_to_the_dra_allocator() -> None:
    pod, _ = admitted(pod_json("p", fraction="0.5"))
    assert pods.dra_claimed(pod)
    assert pod_facts.facts(pod).demand is None
    assert pod_facts.facts(pod_json("q", fraction="0.5")).demand is not None


def test_a_review_only_reads_a_dry_run_and_a_real_one_answer_alike() -> None:
    """Issue #45: forged reviews made a template per request in any namespace. A review now
    makes nothing, so a dry run needs no special case: both get the same answer."""
    body: dict[str, Any] = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u",
            "kind": {"kind": "Pod"},
            "operation": "CREATE",
            "namespace": "kube-system",
            "object": pod_json("p", fraction="0.5"),
            "dryRun": True,
        },
    }
    dry, _ = answer(parse_review(json.dumps(body).encode()), facts=FACTS, mutate=True)
    body["request"]["dryRun"] = False
    real, _ = answer(parse_review(json.dumps(body).encode()), facts=FACTS, mutate=True)
    assert dry == real and dry["response"]["allowed"]


def forged(template: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(template))
    out["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"][
        CAPACITY_GPU_PERCENT
    ] = "100"
    return out


def test_a_template_of_that_name_with_another_spec_refuses_the_pod() -> None:
    """A tenant's template under gpushare's name (a whole GPU for ``gpushare-25pct``) is never
    used: the webhook refuses the pod naming the template and the fix, from the watch."""
    _, template = admitted(pod_json("p", fraction="0.25"))
    templates = ClaimTemplates(device_class="mps.gpushare.io")
    templates.replace([forged(template)])
    facts = replace(
        FACTS, template_check=lambda ns, name: templates.admission_error(ns, name, bound=32)
    )
    verdict = review(pod_json("q", fraction="0.25"), namespace="team", facts=facts, mutate=True)
    assert not verdict.allowed
    assert verdict.errors[0].field == "ResourceClaimTemplate team/gpushare-25pct"
    assert "kubectl delete resourceclaimtemplate" in verdict.message
    other = review(pod_json("q", fraction="0.3"), namespace="team", facts=facts, mutate=True)
    assert other.allowed


def test_one_template_more_than_the_namespaces_bound_refuses_the_pod() -> None:
    templates = ClaimTemplates(device_class="mps.gpushare.io")
    made = [template_of(admitted(pod_json("p", fraction=f"0.{n}"))[0]) for n in (1, 2)]
    templates.replace(made)
    facts = replace(
        FACTS, template_check=lambda ns, name: templates.admission_error(ns, name, bound=2)
    )
    again = review(pod_json("q", fraction="0.1"), namespace="team", facts=facts, mutate=True)
    assert again.allowed  # an existing template: no more of them
    elsewhere = review(pod_json("q", fraction="0.3"), namespace="other", facts=facts, mutate=True)
    assert elsewhere.allowed  # the bound is per namespace
    more = review(pod_json("q", fraction="0.3"), namespace="team", facts=facts, mutate=True)
    assert not more.allowed
    assert "holds 2 (the bound" in more.message and "--dra-templates-per-namespace" in more.message


GATED = replace(FACTS, dra_gate=True)


def test_with_gpushare_placement_the_pod_is_gated_for_the_controller() -> None:
    pod = pod_json("p", fraction="0.3")
    pod["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    verdict = review(pod, namespace="team", facts=GATED, mutate=True)
    assert verdict.allowed, verdict.message
    out = apply_patch(pod, verdict.patch)
    # Its own gate kept; gpushare's added once, however often the webhook is called.
    assert out["spec"]["schedulingGates"] == [
        {"name": "example.com/quota"},
        {"name": PLACEMENT_GATE},
    ]
    again = review(out, namespace="team", facts=GATED, mutate=True)
    assert (
        apply_patch(out, again.patch)["spec"]["schedulingGates"] == out["spec"]["schedulingGates"]
    )
    assert review(out, namespace="team", facts=GATED, mutate=False).allowed


def test_with_kube_scheduler_placement_the_pod_is_not_gated() -> None:
    pod, _ = admitted(pod_json("p", fraction="0.3"))
    assert "schedulingGates" not in pod["spec"]
