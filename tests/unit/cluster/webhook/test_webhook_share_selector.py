"""A GpuShare's selector at admission: a new pod its labels match is linked to the share and
then treated exactly as a pod that named the share (gpushare.cluster.webhook.share_match), in
namespaces whose admin consented; refused when two shares claim it; never across namespaces."""

from dataclasses import replace
from typing import Any

from gpushare.api.label_selector import parse_label_selector
from gpushare.api.names import (
    ANN_CLASS,
    ANN_MEMORY,
    ANN_SHARE,
    RESOURCE_GPU_PERCENT,
    SCHEDULER_NAME,
)
from gpushare.cluster.webhook.facts import ClusterFacts
from gpushare.cluster.webhook.review import review
from tests.fixtures.builders import apply_patch, pod_json, webhook_facts

TRAINER = parse_label_selector({"matchLabels": {"app": "trainer"}})
ANY_APP = parse_label_selector({"matchExpressions": [{"key": "app", "operator": "Exists"}]})


def facts(*selectors: tuple[str, Any], enabled: bool = True, dra: bool = False) -> ClusterFacts:
    """The builders' facts (GpuShare team/infer: 30 %, 12 GiB, latency) with ``selectors``
    for namespace team, which an admin enabled selectors in unless ``enabled`` is False."""
    base = webhook_facts(dra_device_class="mps.gpushare.io" if dra else None)
    return replace(
        base,
        selector_lookup=lambda ns: list(selectors) if ns == "team" else [],
        selectors_enabled=lambda ns: enabled and ns == "team",
    )


def labelled(name: str = "p", namespace: str = "team", **ann: str) -> dict[str, Any]:
    pod = pod_json(name, namespace=namespace, annotations=ann)
    pod["metadata"]["labels"] = {"app": "trainer"}
    return pod


def admitted(pod: dict[str, Any], facts: ClusterFacts) -> dict[str, Any]:
    """The pod as the API server stores it: mutated, then validated."""
    verdict = review(pod, namespace="team", facts=facts, mutate=True)
    assert verdict.allowed, verdict.message
    out = apply_patch(pod, verdict.patch)
    checked = review(out, namespace="team", facts=facts, mutate=False)
    assert checked.allowed, checked.message
    return out


def test_a_labelled_pod_gets_the_shares_link_request_memory_class_and_scheduler() -> None:
    pod = labelled()
    del pod["metadata"]["annotations"]  # a plain pod: only its label
    out = admitted(pod, facts(("infer", TRAINER)))
    ann = out["metadata"]["annotations"]
    assert ann[ANN_SHARE] == "infer"
    assert ann[ANN_MEMORY] == "12Gi" and ann[ANN_CLASS] == "latency"
    assert out["spec"]["containers"][0]["resources"]["limits"][RESOURCE_GPU_PERCENT] == "30"
    assert out["spec"]["schedulerName"] == SCHEDULER_NAME


def test_the_same_link_gives_a_claim_in_dra_mode() -> None:
    out = admitted(labelled(), facts(("infer", TRAINER), dra=True))
    assert out["metadata"]["annotations"][ANN_SHARE] == "infer"
    (claim,) = out["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == "gpushare-30pct-12gi-latency"


def test_a_pods_own_fraction_wins_and_the_shares_memory_and_class_still_apply() -> None:
    out = admitted(labelled(**{"gpushare.io/gpu-fraction": "0.25"}), facts(("infer", TRAINER)))
    ann = out["metadata"]["annotations"]
    assert out["spec"]["containers"][0]["resources"]["limits"][RESOURCE_GPU_PERCENT] == "25"
    assert (ann[ANN_SHARE], ann[ANN_MEMORY], ann[ANN_CLASS]) == ("infer", "12Gi", "latency")


def test_a_pod_that_names_its_share_keeps_it_whatever_its_labels_match() -> None:
    out = admitted(labelled(**{ANN_SHARE: "infer"}), facts(("other", TRAINER)))
    assert out["metadata"]["annotations"][ANN_SHARE] == "infer"


def test_a_pod_two_selectors_match_is_refused_naming_both_shares() -> None:
    verdict = review(
        labelled(),
        namespace="team",
        facts=facts(("infer", TRAINER), ("zany", ANY_APP)),
        mutate=True,
    )
    assert not verdict.allowed
    assert verdict.message.startswith("metadata.labels: match spec.selector of GpuShare infer and")
    assert "GpuShare zany" in verdict.message
    assert "gpushare.io/share: infer" in verdict.message


def test_without_the_namespace_admins_consent_a_label_links_nothing_and_says_so() -> None:
    plain = labelled()
    verdict = review(
        plain, namespace="team", facts=facts(("infer", TRAINER), enabled=False), mutate=True
    )
    assert verdict.allowed and verdict.patch == []
    asking = labelled(**{"gpushare.io/gpu-fraction": "0.5"})
    verdict = review(
        asking, namespace="team", facts=facts(("infer", TRAINER), enabled=False), mutate=True
    )
    assert verdict.allowed
    out = apply_patch(asking, verdict.patch)
    assert ANN_SHARE not in out["metadata"]["annotations"]
    (warning,) = verdict.warnings
    assert (
        "gpushare.io/share-selectors=enabled" in warning and "gpushare.io/share: infer" in warning
    )


def test_a_selector_never_reaches_a_pod_of_another_namespace() -> None:
    pod = labelled(namespace="elsewhere")
    verdict = review(pod, namespace="elsewhere", facts=facts(("infer", TRAINER)), mutate=True)
    assert verdict.allowed and verdict.patch == [] and verdict.warnings == ()


def test_a_labelled_pod_no_selector_matches_is_left_alone() -> None:
    pod = labelled()
    pod["metadata"]["labels"] = {"app": "web"}
    verdict = review(pod, namespace="team", facts=facts(("infer", TRAINER)), mutate=True)
    assert verdict.allowed and verdict.patch == [] and verdict.warnings == ()


def test_validation_alone_links_nothing() -> None:
    """A selector links at mutation; the validating webhook checks the pod as stored."""
    verdict = review(labelled(), namespace="team", facts=facts(("infer", TRAINER)), mutate=False)
    assert verdict.allowed and verdict.patch == []
