"""The webhook's side of opportunistic placement (docs/packing.md, "The sharing contract"): an
opted-in batch pod asks for ``gpushare.io/opportunistic-gpu-percent`` instead of
``gpushare.io/gpu-percent``; an opt-in gpushare cannot honour is refused naming the field."""

from dataclasses import replace
from typing import Any

import pytest

from gpushare.api.names import (
    ANN_CLASS,
    ANN_OPPORTUNISTIC,
    ANN_SHARE,
    RESOURCE_GPU_OPPORTUNISTIC,
    RESOURCE_GPU_PERCENT,
)
from gpushare.api.request import GpuRequest
from gpushare.cluster.webhook.facts import ClusterFacts, PriorityRef
from gpushare.cluster.webhook.review import review
from tests.fixtures.builders import apply_patch, pod_json, webhook_facts

GIB = 1 << 30
FACTS = replace(webhook_facts(), opportunistic_placement=True)
SIZED = GpuRequest(percent=60, memory_bytes=None, share="auto", sized=True)
"""A GpuShare with ``fraction: auto``, sized to 60 % from its profile."""
STATED = GpuRequest(percent=40, memory_bytes=None, share="stated")
"""A GpuShare whose user wrote ``fraction: "0.4"``."""


def with_shares(facts: ClusterFacts = FACTS, **shares: GpuRequest) -> ClusterFacts:
    return replace(facts, share_lookup=lambda ns, name: shares.get(name))


DEFAULT_ON = with_shares(
    replace(FACTS, opportunistic_default=True),
    auto=SIZED,
    stated=STATED,
    latency=replace(SIZED, gpu_class="latency"),
)


def mutated(pod: dict[str, Any], facts: ClusterFacts = FACTS) -> dict[str, Any]:
    verdict = review(pod, namespace="default", facts=facts, mutate=True)
    assert verdict.allowed, verdict.message
    out = apply_patch(pod, verdict.patch)
    # What the mutation made also passes validation, with the same facts.
    check = review(out, namespace="default", facts=facts, mutate=False)
    assert check.allowed, check.message
    return out


def limits(pod: dict[str, Any]) -> dict[str, str]:
    return dict(pod["spec"]["containers"][0]["resources"]["limits"])


def test_an_opted_in_batch_pod_asks_for_the_opportunistic_resource() -> None:
    pod = mutated(pod_json("p", fraction="0.3", annotations={ANN_OPPORTUNISTIC: "true"}))
    assert limits(pod) == {RESOURCE_GPU_OPPORTUNISTIC: "30"}
    assert pod["metadata"]["annotations"][ANN_OPPORTUNISTIC] == "true"


def test_without_an_opt_in_nothing_changes() -> None:
    pod = mutated(pod_json("p", fraction="0.3"))
    assert limits(pod) == {RESOURCE_GPU_PERCENT: "30"}
    assert ANN_OPPORTUNISTIC not in pod["metadata"]["annotations"]


def test_an_explicit_opt_out_wins_over_the_cluster_default() -> None:
    pod = mutated(
        pod_json("p", annotations={ANN_SHARE: "auto", ANN_OPPORTUNISTIC: "false"}), DEFAULT_ON
    )
    assert limits(pod) == {RESOURCE_GPU_PERCENT: "60"}
    opted_out = with_shares(DEFAULT_ON, auto=replace(SIZED, opportunistic=False))
    assert limits(mutated(pod_json("q", annotations={ANN_SHARE: "auto"}), opted_out)) == {
        RESOURCE_GPU_PERCENT: "60"
    }


def test_the_cluster_default_opts_in_pods_whose_request_gpushare_sizes() -> None:
    """Opportunistic by default where the user left the choice to gpushare (issue 65): a pod
    of a GpuShare with fraction: auto; a fraction the user wrote keeps its guarantee."""
    sized = mutated(pod_json("s", annotations={ANN_SHARE: "auto"}), DEFAULT_ON)
    assert limits(sized) == {RESOURCE_GPU_OPPORTUNISTIC: "60"}
    # Where the opt-in came from is written on the pod.
    assert sized["metadata"]["annotations"][ANN_OPPORTUNISTIC] == "true"
    own = mutated(pod_json("f", fraction="0.3"), DEFAULT_ON)
    assert limits(own) == {RESOURCE_GPU_PERCENT: "30"}
    stated = mutated(pod_json("g", annotations={ANN_SHARE: "stated"}), DEFAULT_ON)
    assert limits(stated) == {RESOURCE_GPU_PERCENT: "40"}
    latency = mutated(pod_json("l", annotations={ANN_SHARE: "latency"}), DEFAULT_ON)
    assert limits(latency) == {RESOURCE_GPU_PERCENT: "60"}
    # Without the default, the same sized pod keeps a guarantee.
    assert limits(
        mutated(pod_json("s", annotations={ANN_SHARE: "auto"}), with_shares(auto=SIZED))
    ) == {RESOURCE_GPU_PERCENT: "60"}


def test_a_gpushare_opt_in_carries_to_its_pods_and_the_pod_may_opt_out() -> None:
    facts = with_shares(
        train=GpuRequest(percent=40, memory_bytes=8 * GIB, share="train", opportunistic=True)
    )
    pod = mutated(pod_json("p", annotations={ANN_SHARE: "train"}), facts)
    assert limits(pod) == {RESOURCE_GPU_OPPORTUNISTIC: "40"}
    out = mutated(
        pod_json("q", annotations={ANN_SHARE: "train", ANN_OPPORTUNISTIC: "false"}), facts
    )
    assert limits(out) == {RESOURCE_GPU_PERCENT: "40"}


@pytest.mark.parametrize(
    ("annotations", "fraction", "says"),
    [
        ({ANN_OPPORTUNISTIC: "true", ANN_CLASS: "latency"}, "0.3", "latency"),
        ({ANN_OPPORTUNISTIC: "true"}, "2", "one GPU"),
        ({ANN_OPPORTUNISTIC: "yes"}, "0.3", ANN_OPPORTUNISTIC),
    ],
)
def test_an_opt_in_gpushare_cannot_honour_is_refused_naming_the_field(
    annotations: dict[str, str], fraction: str, says: str
) -> None:
    verdict = review(
        pod_json("p", fraction=fraction, annotations=annotations),
        namespace="default",
        facts=FACTS,
        mutate=True,
    )
    assert not verdict.allowed
    assert ANN_OPPORTUNISTIC in verdict.message
    assert says in verdict.message


def test_dra_mode_refuses_an_explicit_opt_in_and_ignores_the_default() -> None:
    dra = replace(
        webhook_facts(dra_device_class="gpushare.io"),
        opportunistic_placement=True,
        opportunistic_default=True,
    )
    refused = review(
        pod_json("p", fraction="0.3", annotations={ANN_OPPORTUNISTIC: "true"}),
        namespace="default",
        facts=dra,
        mutate=True,
    )
    assert not refused.allowed
    assert "DRA" in refused.message
    plain = review(
        pod_json("q", annotations={ANN_SHARE: "auto"}),
        namespace="default",
        facts=with_shares(dra, auto=SIZED),
        mutate=True,
    )
    assert plain.allowed, plain.message
    assert RESOURCE_GPU_OPPORTUNISTIC not in str(plain.patch)


def test_validation_refuses_both_resources_on_one_pod() -> None:
    pod = mutated(pod_json("p", fraction="0.3", annotations={ANN_OPPORTUNISTIC: "true"}))
    pod["spec"]["containers"][0]["resources"]["limits"][RESOURCE_GPU_PERCENT] = "30"
    verdict = review(pod, namespace="default", facts=FACTS, mutate=False)
    assert not verdict.allowed
    assert RESOURCE_GPU_PERCENT in verdict.message


def test_a_latency_pod_cannot_take_the_opportunistic_resource_by_hand() -> None:
    pod = pod_json("p", fraction="0.3", annotations={ANN_CLASS: "latency"}, scheduled=True)
    pod["spec"]["containers"][0]["resources"] = {
        "limits": {RESOURCE_GPU_OPPORTUNISTIC: "30"},
        "requests": {RESOURCE_GPU_OPPORTUNISTIC: "30"},
    }
    verdict = review(pod, namespace="default", facts=FACTS, mutate=False)
    assert not verdict.allowed
    assert "latency" in verdict.message


def test_where_opportunistic_placement_is_not_enabled_an_opt_in_is_refused_with_the_flag() -> None:
    off = replace(webhook_facts(), opportunistic_placement=False)
    verdict = review(
        pod_json("p", fraction="0.3", annotations={ANN_OPPORTUNISTIC: "true"}),
        namespace="default",
        facts=off,
        mutate=True,
    )
    assert not verdict.allowed
    assert "--opportunistic-placement" in verdict.message
    # The cluster default alone opts no pod in while the feature is off.
    sized = replace(DEFAULT_ON, opportunistic_placement=False)
    plain = mutated(pod_json("q", annotations={ANN_SHARE: "auto"}), sized)
    assert limits(plain) == {RESOURCE_GPU_PERCENT: "60"}


def test_an_opted_in_pod_gets_the_lower_priority_class_unless_it_names_one() -> None:
    """kube-scheduler tries higher priorities first: a guaranteed pod waiting beside an
    opportunistic one is placed first instead of preempting it right after."""
    low = PriorityRef("gpushare-opportunistic", -10, "Never")
    facts = replace(FACTS, opportunistic_priority=low)
    spec = mutated(pod_json("p", fraction="0.3", annotations={ANN_OPPORTUNISTIC: "true"}), facts)[
        "spec"
    ]
    assert (spec["priorityClassName"], spec["priority"], spec["preemptionPolicy"]) == (
        "gpushare-opportunistic",
        -10,
        "Never",
    )
    own = pod_json(
        "q",
        fraction="0.3",
        annotations={ANN_OPPORTUNISTIC: "true"},
        extra_spec={"priorityClassName": "team-batch", "priority": 100},
    )
    kept = mutated(own, facts)["spec"]
    assert (kept["priorityClassName"], kept["priority"]) == ("team-batch", 100)
    plain = mutated(pod_json("r", fraction="0.3"), facts)["spec"]
    assert "priorityClassName" not in plain and "priority" not in plain
