"""The ValidatingAdmissionPolicy guarding placement annotations after admission: which keys,
which writers, and where. What the API server does with it: tests/cluster/
test_hostile_placement_update.py."""

import re

from gpushare.api.names import (
    ANN_BIND_TIME,
    ANN_GPU_UUID,
    ANN_MEMORY_LIMIT,
    ANN_STATE,
    ANN_THREAD_PERCENT,
)
from tests.fixtures.helm_chart import Chart

POLICY = "ValidatingAdmissionPolicy"
BINDING = "ValidatingAdmissionPolicyBinding"


def _writers(policy: dict) -> list[str]:  # type: ignore[type-arg]
    (condition,) = policy["spec"]["matchConditions"]
    return re.findall(r"'([^']+)'", condition["expression"])


def test_guards_every_placement_key_on_pod_updates(chart: Chart) -> None:
    rendered = chart.render()
    policy = rendered.get(POLICY, "gpushare-placement-annotations")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    # UPDATE of the pod itself: pods/binding (how binds write them) is another resource.
    assert (rule["operations"], rule["resources"]) == (["UPDATE"], ["pods"])
    keys = next(v for v in policy["spec"]["variables"] if v["name"] == "keys")
    assert re.findall(r"'([^']+)'", keys["expression"]) == [
        ANN_GPU_UUID,
        ANN_THREAD_PERCENT,
        ANN_MEMORY_LIMIT,
        ANN_BIND_TIME,
        ANN_STATE,
    ]
    assert policy["spec"]["failurePolicy"] == "Fail"
    (validation,) = policy["spec"]["validations"]
    assert "metadata.annotations[" in validation["messageExpression"]
    assert "fix:" in validation["messageExpression"]
    binding = rendered.get(BINDING, "gpushare-placement-annotations")
    assert binding["spec"] == {
        "policyName": "gpushare-placement-annotations",
        "validationActions": ["Deny"],
    }


def test_only_the_controller_and_node_agent_service_accounts_may_write(chart: Chart) -> None:
    rendered = chart.render(release="r", namespace="gpu-system")
    accounts = {
        rendered.get("Deployment", "r-gpushare-controller")["spec"]["template"]["spec"][
            "serviceAccountName"
        ],
        rendered.get("DaemonSet", "r-gpushare-node-agent")["spec"]["template"]["spec"][
            "serviceAccountName"
        ],
    }
    policy = rendered.get(POLICY, "r-gpushare-placement-annotations")
    assert sorted(_writers(policy)) == sorted(
        f"system:serviceaccount:gpu-system:{a}" for a in accounts
    )
    # The scheduler's ServiceAccount does not write them (binds are pods/binding).
    assert not [w for w in _writers(policy) if "scheduler" in w]


def test_extra_writers_and_namespace_selector(chart: Chart) -> None:
    rendered = chart.render(
        {
            "placementGuard": {
                "extraWriters": ["system:serviceaccount:ops:fixer"],
                "namespaceSelector": {"matchLabels": {"gpu": "yes"}},
            }
        }
    )
    policy = rendered.get(POLICY, "gpushare-placement-annotations")
    assert "system:serviceaccount:ops:fixer" in _writers(policy)
    binding = rendered.get(BINDING, "gpushare-placement-annotations")
    assert binding["spec"]["matchResources"] == {
        "namespaceSelector": {"matchLabels": {"gpu": "yes"}}
    }


def test_can_be_turned_off(chart: Chart) -> None:
    rendered = chart.render({"placementGuard": {"enabled": False}})
    assert not rendered.all(POLICY) and not rendered.all(BINDING)


def test_a_writer_name_that_would_break_the_expression_is_refused(chart: Chart) -> None:
    error = chart.fails({"placementGuard": {"extraWriters": ["x' || true || '"]}})
    assert "extraWriters" in error
