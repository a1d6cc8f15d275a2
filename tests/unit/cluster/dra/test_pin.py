"""The node pin written with the gate's removal: every pod shape the API server lets a gated
pod gain it in (docs/dra.md, "Who places a claim"), and none it would refuse."""

from typing import Any

import pytest

from gpushare.cluster.dra.pin import pin_ops
from tests.fixtures.builders import apply_patch

PIN = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
ZONE = {"key": "zone", "operator": "In", "values": ["a"]}


def pod(affinity: Any = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": "p"}, "spec": {"containers": [], **spec}}
    if affinity is not None:
        body["spec"]["affinity"] = affinity
    return body


def required(pinned: dict[str, Any]) -> list[dict[str, Any]]:
    node = pinned["spec"]["affinity"]["nodeAffinity"]
    terms: list[dict[str, Any]] = node["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return terms


def test_a_pod_without_affinity_gets_one_term_naming_the_node() -> None:
    assert required(apply_patch(pod(), pin_ops(pod(), "n1"))) == [{"matchFields": [PIN]}]


@pytest.mark.parametrize(
    "affinity",
    [
        {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
    ],
    ids=["pod-affinity-only", "preferred-only"],
)
def test_what_the_pod_has_is_kept_beside_the_new_requirement(affinity: dict[str, Any]) -> None:
    body = pod(affinity)
    pinned = apply_patch(body, pin_ops(body, "n1"))
    assert required(pinned) == [{"matchFields": [PIN]}]
    for key, value in affinity.items():
        kept = pinned["spec"]["affinity"][key]
        assert all(kept[k] == v for k, v in value.items())


def test_each_of_the_users_terms_gains_the_node_and_keeps_its_own_requirements() -> None:
    terms = [{"matchExpressions": [ZONE]}, {"matchFields": [ZONE]}]
    body = pod({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}})  # fmt: skip
    assert required(apply_patch(body, pin_ops(body, "n1"))) == [
        {"matchExpressions": [ZONE], "matchFields": [PIN]},
        {"matchFields": [ZONE, PIN]},
    ]


@pytest.mark.parametrize(
    "affinity",
    [
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{}]}}},
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": "oops"}}},
        {"nodeAffinity": "oops"},
        "oops",
    ],
    ids=["empty-term", "terms-not-a-list", "node-affinity-not-an-object", "not-an-object"],
)  # fmt: skip
def test_a_shape_the_api_server_would_refuse_gets_no_pin(affinity: Any) -> None:
    assert pin_ops(pod(affinity), "n1") == []


def test_the_pin_is_guarded_by_what_it_was_made_from() -> None:
    """Changed since it was watched: the test operation fails (the API server's 422) and the
    allocator removes the gate without the pin."""
    ops = pin_ops(pod(), "n1")
    changed = pod({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}})
    with pytest.raises(AssertionError, match="test of /spec/affinity failed"):
        apply_patch(changed, ops)
