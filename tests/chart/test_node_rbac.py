"""Node agent RBAC: read pods, mark them allocated, publish its node, report events."""

from tests.fixtures.helm_chart import Chart


def test_node_agent_may_not_create_delete_or_read_secrets(chart: Chart) -> None:
    rendered = chart.render()
    role = rendered.get("ClusterRole", "gpushare-node-agent")
    granted = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert ("", "pods", "list") in granted
    assert ("", "pods", "patch") in granted
    assert ("", "nodes", "patch") in granted
    assert ("", "events", "create") in granted
    assert not [x for x in granted if x[2] in ("delete", "deletecollection", "*")]
    assert not [x for x in granted if x[1] in ("secrets", "nodes/status", "pods/exec", "*")]
    assert not [x for x in granted if x[1] == "pods" and x[2] == "create"]


def test_daemonset_read_only_its_own(chart: Chart) -> None:
    role = chart.render(release="x").get("Role", "x-gpushare-node-agent")
    assert role["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["daemonsets"],
            "resourceNames": ["x-gpushare-node-agent"],
            "verbs": ["get"],
        }
    ]
