"""The claim-sharing policy: in dra mode the API server refuses a ResourceClaim status on
gpushare's GPUs reserved for more than one pod (issue 67: one claim shared by 8 pods was
prepared and accounted once). Its CEL runs on the API server in
tests/faults/test_security_cluster.py (dra mode)."""

from tests.fixtures.helm_chart import LOCAL_VALUES, Chart


def _policies(rendered: object, kind: str) -> list[dict[str, object]]:
    return [
        p
        for p in rendered.all(kind)  # type: ignore[attr-defined]
        if str(p["metadata"]["name"]).endswith("-claim-sharing")
    ]


def test_device_plugin_mode_makes_no_claim_sharing_policy(chart: Chart) -> None:
    assert _policies(chart.render(), "ValidatingAdmissionPolicy") == []


def test_dra_mode_refuses_a_gpushare_claim_reserved_for_several_pods(chart: Chart) -> None:
    rendered = chart.render({"mode": "dra"}, values_files=[LOCAL_VALUES])
    (policy,) = _policies(rendered, "ValidatingAdmissionPolicy")
    (binding,) = _policies(rendered, "ValidatingAdmissionPolicyBinding")
    spec = policy["spec"]
    assert isinstance(spec, dict)
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert set(rule["resources"]) == {"resourceclaims", "resourceclaims/status"}
    (condition,) = spec["matchConditions"]
    assert "size(object.status.reservedFor) > 1" in condition["expression"]
    assert "r.driver == 'gpu.gpushare.io'" in condition["expression"]
    assert "give each pod a claim of its own" in spec["validations"][0]["messageExpression"]
    assert binding["spec"]["validationActions"] == ["Deny"]
