"""The pre-delete hook: removes the node agents first, with a role that can do only that."""

from tests.fixtures.helm_chart import Chart, container


def test_job_is_a_pre_delete_hook_that_never_lingers(chart: Chart) -> None:
    job = chart.render().get("Job", "gpushare-uninstall")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-delete"
    assert set(annotations["helm.sh/hook-delete-policy"].split(",")) == {
        "before-hook-creation",
        "hook-succeeded",
        "hook-failed",
    }
    c = container(job, "uninstall")
    assert c["command"][-1] == "uninstall"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["DAEMONSET_NAME"] == "gpushare-node-agent"
    assert job["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_hook_role_deletes_only_the_agent_daemonset(chart: Chart) -> None:
    rendered = chart.render()
    role = rendered.get("Role", "gpushare-uninstall")
    assert role["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["daemonsets"],
            "resourceNames": ["gpushare-node-agent"],
            "verbs": ["get", "delete"],
        }
    ]
    # RBAC and script are release objects, not hooks: they exist when the hook runs.
    for kind, name in (
        ("ServiceAccount", "gpushare-uninstall"),
        ("ConfigMap", "gpushare-lifecycle"),
    ):
        assert "helm.sh/hook" not in (rendered.get(kind, name)["metadata"].get("annotations") or {})


def test_no_hook_when_node_cleanup_is_off(chart: Chart) -> None:
    rendered = chart.render({"uninstall": {"cleanupNodes": False}})
    assert not rendered.all("Job")
