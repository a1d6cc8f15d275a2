"""The ValidatingAdmissionPolicy guarding placement annotations after admission: which keys,
which writers, and where. What the API server does with it: tests/cluster/
test_hostile_placement_update.py."""

import re

from tests.fixtures.helm_chart import Chart

POLICY = "ValidatingAdmissionPolicy"
BINDING = "ValidatingAdmissionPolicyBinding"


def _writers(policy: dict) -> list[str]:  # type: ignore[type-arg]
    (condition,) = policy["spec"]["matchConditions"]
    return re.findall(r"'([^']+)'", condition["expression"])


def test_guards_every_gpushare_annotation_on_pod_and_status_updates(chart: Chart) -> None:
    rendered = chart.render()
    policy = rendered.get(POLICY, "gpushare-placement-annotations")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    # UPDATE of the pod and of its status (annotations change through both); pods/binding
    # (how binds write them) is another resource.
    assert (rule["operations"], rule["resources"]) == (["UPDATE"], ["pods", "pods/status"])
    changed = next(v for v in policy["spec"]["variables"] if v["name"] == "changed")
    # Every key under gpushare.io/ (request, rules, placement, and keys added later), added,
    # changed or removed.
    assert changed["expression"].count("k.startsWith('gpushare.io/')") == 2
    assert "!(k in variables.after)" in changed["expression"]
    assert "!(k in variables.before)" in changed["expression"]
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
    names = [o["metadata"]["name"] for o in rendered.all(POLICY) + rendered.all(BINDING)]
    assert "gpushare-placement-annotations" not in names


def test_a_writer_name_that_would_break_the_expression_is_refused(chart: Chart) -> None:
    error = chart.fails({"placementGuard": {"extraWriters": ["x' || true || '"]}})
    assert "extraWriters" in error
