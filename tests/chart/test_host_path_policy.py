"""The ValidatingAdmissionPolicy keeping every pod, gpushare's or not, off the protected host
directories (issue #45): which directories, which namespaces are exempt, where it applies. What
the API server does with it (a plain pod mounting each, also as a parent or written with "//"
and "/./"): tests/faults/test_security_cluster.py,
``a_plain_pod_mounts_the_kubelet_plugin_and_cdi_directories``."""

import re

from tests.fixtures.helm_chart import Chart

POLICY = "ValidatingAdmissionPolicy"
BINDING = "ValidatingAdmissionPolicyBinding"
NAME = "gpushare-host-paths"


def _variable(policy: dict, name: str) -> str:  # type: ignore[type-arg]
    return str(next(v for v in policy["spec"]["variables"] if v["name"] == name)["expression"])


def _protected(policy: dict) -> list[str]:  # type: ignore[type-arg]
    return re.findall(r"'([^']+)'", _variable(policy, "protected"))


def _exempt(policy: dict) -> list[str]:  # type: ignore[type-arg]
    condition = policy["spec"]["matchConditions"][0]
    assert condition["name"] == "not-an-exempt-namespace"
    return re.findall(r"'([^']+)'", condition["expression"])


def test_every_pod_is_kept_off_the_kubelet_plugin_cdi_and_mps_directories(chart: Chart) -> None:
    rendered = chart.render()
    policy = rendered.get(POLICY, NAME)
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    # Every pod's creation (volumes never change after it); no gpushare annotation needed.
    assert (rule["operations"], rule["resources"]) == (["CREATE"], ["pods"])
    assert policy["spec"]["failurePolicy"] == "Fail"
    protected = _protected(policy)
    for path in (
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/pod-resources",
        "/var/lib/kubelet/plugins",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
        "/etc/cdi",
        "/run/gpushare/node/mps",
        "/tmp/nvidia-mps",
    ):
        assert path in protected, path
    exposed = _variable(policy, "exposed")
    # The path itself, below it, and a parent of it (/ or /var/lib expose it too).
    for test in ("p == q", "p.startsWith(q + '/')", "q.startsWith(p + '/')", "p == '/'"):
        assert test in exposed, test
    assert "replace('//', '/')" in _variable(policy, "hostPaths")
    (validation,) = policy["spec"]["validations"]
    message = validation["messageExpression"]
    assert "spec.volumes[].hostPath.path" in message and "fix:" in message
    assert "hostPathGuard.exemptNamespaces" in message
    binding = rendered.get(BINDING, NAME)
    assert binding["spec"] == {"policyName": NAME, "validationActions": ["Deny"]}


def test_the_release_namespace_and_named_node_daemons_are_exempt(chart: Chart) -> None:
    policy = chart.render(namespace="gpu-system").get(POLICY, NAME)
    assert _exempt(policy) == ["gpu-system", "kube-system"]
    values = {"hostPathGuard": {"exemptNamespaces": ["kube-system", "longhorn-system"]}}
    assert _exempt(chart.render(values).get(POLICY, NAME)) == [
        "gpushare-system",
        "kube-system",
        "longhorn-system",
    ]


def test_directories_follow_the_chart_settings(chart: Chart) -> None:
    values = {
        "node": {"kubeletRoot": "/data/kubelet", "mpsRoot": "/srv/mps"},
        "dra": {"cdiDir": "/srv/cdi"},
        "hostPathGuard": {"extraPaths": ["/opt/secret/"]},
    }
    protected = _protected(chart.render(values).get(POLICY, NAME))
    for path in (
        "/data/kubelet/device-plugins",
        "/data/kubelet/plugins",
        "/data/kubelet/plugins_registry",
        "/srv/cdi",
        "/srv/mps",
        "/opt/secret",
    ):
        assert path in protected, path


def test_can_be_scoped_or_turned_off(chart: Chart) -> None:
    selector = {"matchLabels": {"team": "a"}}
    binding = chart.render({"hostPathGuard": {"namespaceSelector": selector}}).get(BINDING, NAME)
    assert binding["spec"]["matchResources"]["namespaceSelector"] == selector
    rendered = chart.render({"hostPathGuard": {"enabled": False}})
    assert not rendered.has(POLICY, NAME) and not rendered.has(BINDING, NAME)
    assert "exemptNamespaces" in chart.fails({"hostPathGuard": {"exemptNamespaces": ["Bad NS"]}})
