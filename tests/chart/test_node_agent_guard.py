"""The ValidatingAdmissionPolicy confining each node agent to its own node, the pods bound
to it and its ResourceSlices, by the node name claim of its bound ServiceAccount token. What
the API server does with it: tests/faults/test_security_cluster.py."""

from tests.fixtures.helm_chart import Chart

POLICY = "ValidatingAdmissionPolicy"
NAME = "r-gpushare-node-agent-scope"


def test_matches_only_the_node_agents_writes_and_compares_the_claim(chart: Chart) -> None:
    rendered = chart.render(release="r", namespace="gpu-system")
    policy = rendered.get(POLICY, NAME)
    core, dra, leases = policy["spec"]["matchConstraints"]["resourceRules"]
    assert set(core["resources"]) == {"nodes", "nodes/status", "pods", "pods/status"}
    assert set(core["operations"]) == {"UPDATE", "DELETE"}
    # DRA mode: the agent writes its node's ResourceSlices, and only those.
    assert (dra["apiGroups"], dra["resources"]) == (["resource.k8s.io"], ["resourceslices"])
    assert set(dra["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    # Its Lease (the controller's sign of life): its own node's only.
    assert (leases["apiGroups"], leases["resources"]) == (["coordination.k8s.io"], ["leases"])
    assert set(leases["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == (
        "request.userInfo.username == 'system:serviceaccount:gpu-system:r-gpushare-node-agent'"
    )
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert "authentication.kubernetes.io/node-name" in variables["claim"]
    assert "oldObject.spec.nodeName" in variables["before"]
    assert "object.spec.nodeName" in variables["after"]
    expressions = [v["expression"] for v in policy["spec"]["validations"]]
    assert expressions == [
        "variables.node != ''",
        "!variables.lease || request.name == 'gpushare-agent-' + variables.node",
        "variables.lease || variables.target == variables.node",
    ]
    assert all(
        "fix:" in (v.get("message") or v["messageExpression"])
        for v in policy["spec"]["validations"]
    )
    binding = rendered.get("ValidatingAdmissionPolicyBinding", NAME)
    assert binding["spec"] == {"policyName": NAME, "validationActions": ["Deny"]}


def test_can_be_turned_off(chart: Chart) -> None:
    assert not [
        o
        for o in chart.render({"nodeAgentGuard": {"enabled": False}}).all(POLICY)
        if o["metadata"]["name"].endswith("agent-scope")
    ]
