"""The ValidatingAdmissionPolicies on the protected host directories (issue #45): which
directories, which namespaces are exempt, where they apply; gpushare's pods refused, other pods
only warned about unless an admin asks (issue #66: the GPU Operator, node-exporter and log
collectors mount them by design). What the API server does with them: the add-ons' real pod
specs admitted and gpushare pods refused, tests/cluster/test_host_path_neighbours.py; a plain
pod mounting each, also as a parent or written with "//" and "/./", refused under
``otherPods: deny``, tests/faults/test_security_cluster.py,
``a_plain_pod_mounts_the_kubelet_plugin_and_cdi_directories``."""

import re

from tests.fixtures.helm_chart import Chart

POLICY = "ValidatingAdmissionPolicy"
BINDING = "ValidatingAdmissionPolicyBinding"
NAME = "gpushare-host-paths"
OTHERS = "gpushare-host-paths-others"


def _variable(policy: dict, name: str) -> str:  # type: ignore[type-arg]
    return str(next(v for v in policy["spec"]["variables"] if v["name"] == name)["expression"])


def _protected(policy: dict) -> list[str]:  # type: ignore[type-arg]
    return re.findall(r"'([^']+)'", _variable(policy, "protected"))


def _exempt(policy: dict) -> list[str]:  # type: ignore[type-arg]
    condition = policy["spec"]["matchConditions"][0]
    assert condition["name"] == "not-an-exempt-namespace"
    return re.findall(r"'([^']+)'", condition["expression"])


def _whose(policy: dict) -> tuple[str, str]:  # type: ignore[type-arg]
    condition = policy["spec"]["matchConditions"][1]
    return condition["name"], condition["expression"]


def test_every_pod_is_kept_off_the_kubelet_plugin_cdi_and_mps_directories(chart: Chart) -> None:
    rendered = chart.render()
    policy = rendered.get(POLICY, NAME)
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    # Every pod's creation (volumes never change after it).
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
    binding = rendered.get(BINDING, NAME)
    assert binding["spec"] == {"policyName": NAME, "validationActions": ["Deny"]}


def test_only_gpushares_pods_are_refused_by_default_others_are_warned_about(chart: Chart) -> None:
    rendered = chart.render()
    name, test = _whose(rendered.get(POLICY, NAME))
    assert name == "gpushare-pods"
    # A gpushare annotation, a gpushare resource in any container, or gpushare's scheduler.
    for part in (
        "annotations.exists(k, k.startsWith('gpushare.io/'))",
        "object.spec.schedulerName == 'gpushare-scheduler'",
        "object.spec.containers.exists(",
        "object.spec.initContainers.exists(",
        "r.startsWith('gpushare.io/')",
    ):
        assert part in test, part
    others = rendered.get(POLICY, OTHERS)
    assert _whose(others) == ("other-pods", f"!({test})")
    assert _variable(others, "exposed") == _variable(rendered.get(POLICY, NAME), "exposed")
    assert "hostPathGuard.exemptNamespaces" in others["spec"]["validations"][0]["messageExpression"]
    # Admitted, with a warning to the creator and an audit annotation: never Deny by default.
    assert rendered.get(BINDING, OTHERS)["spec"] == {
        "policyName": OTHERS,
        "validationActions": ["Warn", "Audit"],
    }
    denied = chart.render({"hostPathGuard": {"otherPods": "deny"}})
    assert denied.get(BINDING, OTHERS)["spec"]["validationActions"] == ["Deny"]
    off = chart.render({"hostPathGuard": {"otherPods": "off"}})
    assert off.has(POLICY, NAME) and not off.has(POLICY, OTHERS) and not off.has(BINDING, OTHERS)
    assert "otherPods" in chart.fails({"hostPathGuard": {"otherPods": "Deny"}})


def test_a_long_release_name_keeps_both_policy_names_apart(chart: Chart) -> None:
    rendered = chart.render(release="r" * 53)
    guards = [p for p in rendered.all(POLICY) if len(p["spec"]["matchConditions"]) == 3]
    names = {_whose(p)[0]: p["metadata"]["name"] for p in guards}
    mine, others = names["gpushare-pods"], names["other-pods"]
    assert len(others) <= 63 and others == mine + "-others", (mine, others)


def test_the_release_namespace_and_named_node_daemons_are_exempt(chart: Chart) -> None:
    rendered = chart.render(namespace="gpu-system")
    for name in (NAME, OTHERS):
        assert _exempt(rendered.get(POLICY, name)) == ["gpu-system", "kube-system"]
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
    rendered = chart.render({"hostPathGuard": {"namespaceSelector": selector}})
    for name in (NAME, OTHERS):
        assert (
            rendered.get(BINDING, name)["spec"]["matchResources"]["namespaceSelector"] == selector
        )
    # Other pods: also only in namespaces of their own selector (both must match).
    tenants = {
        "matchLabels": {"tier": "tenant"},
        "matchExpressions": [{"key": "x", "operator": "Exists"}],
    }
    values = {"namespaceSelector": selector, "otherPodsNamespaceSelector": tenants}
    rendered = chart.render({"hostPathGuard": values})
    assert rendered.get(BINDING, NAME)["spec"]["matchResources"]["namespaceSelector"] == selector
    assert rendered.get(BINDING, OTHERS)["spec"]["matchResources"]["namespaceSelector"] == {
        "matchLabels": {"team": "a", "tier": "tenant"},
        "matchExpressions": [{"key": "x", "operator": "Exists"}],
    }
    rendered = chart.render({"hostPathGuard": {"enabled": False}})
    assert not rendered.has(POLICY, NAME) and not rendered.has(BINDING, NAME)
    assert not rendered.has(POLICY, OTHERS)
    assert "exemptNamespaces" in chart.fails({"hostPathGuard": {"exemptNamespaces": ["Bad NS"]}})
