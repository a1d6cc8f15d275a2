"""gpushare-scheduler RBAC: Kubernetes' own scheduler roles plus its own Lease, nothing more."""

from tests.fixtures.helm_chart import Chart


def test_bound_to_the_built_in_scheduler_roles(chart: Chart) -> None:
    rendered = chart.render()
    roles = {
        b["roleRef"]["name"]
        for b in rendered.all("ClusterRoleBinding")
        if b["subjects"][0]["name"] == "gpushare-scheduler"
    }
    assert roles == {"system:kube-scheduler", "system:volume-scheduler"}
    reader = rendered.get("RoleBinding", "gpushare-scheduler-authentication-reader")
    assert reader["metadata"]["namespace"] == "kube-system"
    assert reader["roleRef"]["name"] == "extension-apiserver-authentication-reader"
    assert not [r for r in rendered.all("ClusterRole") if "scheduler" in r["metadata"]["name"]]


def test_lease_rights_only_on_its_own_lease(chart: Chart) -> None:
    role = chart.render().get("Role", "gpushare-scheduler")
    named = [r for r in role["rules"] if "resourceNames" in r]
    unnamed = [r for r in role["rules"] if "resourceNames" not in r]
    assert named == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["gpushare-scheduler"],
            "verbs": ["get", "update"],
        }
    ]
    # create cannot be limited by name (the object does not exist yet).
    assert [r["verbs"] for r in unnamed] == [["create"]]
