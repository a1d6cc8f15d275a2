"""The webhook adds the tolerations and runtime class the controller names to gpushare pods
(GKE taints GPU nodes nvidia.com/gpu and tolerates it only for pods asking nvidia.com/gpu;
docs/scheduling.md, "Admission webhook"); a pod keeps what it says itself."""

from dataclasses import replace
from typing import Any

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.api.tolerations import check_runtime_class, parse_toleration
from gpushare.cluster.settings import parse_args
from gpushare.cluster.webhook.facts import ClusterFacts
from gpushare.cluster.webhook.review import review
from tests.fixtures.builders import apply_patch, pod_json, webhook_facts

GKE = parse_toleration("nvidia.com/gpu:NoSchedule")
FACTS = replace(webhook_facts(), pod_tolerations=(GKE,), pod_runtime_class="nvidia")


def mutated(pod: dict[str, Any], facts: ClusterFacts = FACTS) -> dict[str, Any]:
    verdict = review(pod, namespace="default", facts=facts, mutate=True)
    assert verdict.allowed, verdict.message
    return apply_patch(pod, verdict.patch)


def test_a_gpushare_pod_tolerates_the_gpu_taint_and_gets_the_runtime_class() -> None:
    out = mutated(pod_json("p", fraction="0.25"))
    assert out["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert out["spec"]["runtimeClassName"] == "nvidia"


def test_a_pod_keeps_its_own_tolerations_and_runtime_class() -> None:
    own = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}
    other = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    pod = pod_json(
        "p", fraction="0.25", extra_spec={"tolerations": [own, other], "runtimeClassName": "kata"}
    )
    out = mutated(pod)
    # Its own toleration of that key (any effect) covers the taint: nothing is added.
    assert out["spec"]["tolerations"] == [own, other]
    assert out["spec"]["runtimeClassName"] == "kata"
    # Another key's toleration does not: the GPU one is appended, the pod's kept.
    out = mutated(pod_json("q", fraction="0.25", extra_spec={"tolerations": [other]}))
    assert out["spec"]["tolerations"] == [other, GKE]


def test_a_pod_that_is_not_a_gpushare_pod_gets_nothing() -> None:
    verdict = review(pod_json("plain"), namespace="default", facts=FACTS, mutate=True)
    assert verdict.allowed and not verdict.patch


def test_the_controller_default_tolerates_the_gke_taint_and_none_turns_it_off() -> None:
    assert parse_args([]).pod_tolerations == ("nvidia.com/gpu:NoSchedule",)
    assert parse_args(["--pod-toleration=none"]).pod_tolerations == ()
    settings = parse_args(["--pod-toleration=sku=gpu:NoSchedule", "--pod-runtime-class=nvidia"])
    assert [parse_toleration(t) for t in settings.pod_tolerations] == [
        {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
    ]
    assert settings.pod_runtime_class == "nvidia"


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--pod-toleration=nvidia.com/gpu", "names no effect"),
        ("--pod-toleration=nvidia.com/gpu:Sometimes", "names no effect"),
        ("--pod-toleration=bad key:NoSchedule", "is not a taint key"),
        ("--pod-toleration=k=a b:NoSchedule", "is not a taint value"),
        ("--pod-runtime-class=Not_A_Name", "is not a RuntimeClass name"),
    ],
)
def test_bad_flags_are_refused_naming_the_flag(flag: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message) as caught:
        parse_args([flag])
    assert flag.split("=", 1)[0] in str(caught.value)
    assert check_runtime_class("") == ""
