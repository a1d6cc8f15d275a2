"""Node agent RBAC: read pods, mark them allocated, publish its node, report events."""

from tests.fixtures.helm_chart import Chart


def test_node_agent_may_not_create_delete_or_read_secrets(chart: Chart) -> None:
    rendered = chart.render()
    role = rendered.get("ClusterRole", "gpushare-node-agent")
    granted = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule.get("apiGroups", [])
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert ("", "pods", "list") in granted
    assert ("", "pods", "patch") in granted
    # It reads pods only as a list or a watch of its node's (field selector spec.nodeName,
    # tests/unit/kube/test_node_kube.py): no get of any pod of the cluster (issue #45). The
    # watch wakes its pause loop (issue 65); it shows no more than the list.
    assert {v for g, r, v in granted if r == "pods"} == {"list", "watch", "patch"}
    assert ("", "nodes", "patch") in granted
    assert ("", "events", "create") in granted
    assert not [x for x in granted if x[2] in ("delete", "deletecollection", "*")]
    assert not [x for x in granted if x[1] in ("secrets", "nodes/status", "pods/exec", "*")]
    assert not [x for x in granted if x[1] == "pods" and x[2] == "create"]


def test_daemonset_read_only_its_own_and_leases_written_in_its_namespace_only(
    chart: Chart,
) -> None:
    """Its DaemonSet for the preStop cleanup; its node's Lease, renewed so the controller
    notices a dead agent (the node-agent guard policy confines it to its own node's Lease,
    tests/chart/test_node_agent_guard.py); no read of any other Lease."""
    role = chart.render(release="x", namespace="gpu-system").get("Role", "x-gpushare-node-agent")
    assert role["metadata"]["namespace"] == "gpu-system"
    assert role["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["daemonsets"],
            "resourceNames": ["x-gpushare-node-agent"],
            "verbs": ["get"],
        },
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["create", "patch"],
        },
    ]
    cluster_role = chart.render(release="x").get("ClusterRole", "x-gpushare-node-agent")
    assert not [r for r in cluster_role["rules"] if "leases" in r["resources"]]


def _granted(role: dict[str, object]) -> set[tuple[str, str, str]]:
    rules = role["rules"]
    assert isinstance(rules, list)
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def test_dra_agent_manages_resource_slices_and_reads_claims(chart: Chart) -> None:
    """The DRA driver publishes (and removes stale) ResourceSlices and reads the claims it
    prepares and their namespaces (sharing groups); it never writes claims, and the
    device-plugin mode gets none of it."""
    granted = _granted(chart.render({"mode": "dra"}).get("ClusterRole", "gpushare-node-agent"))
    for verb in ("list", "create", "update", "delete"):
        assert ("resource.k8s.io", "resourceslices", verb) in granted
    assert [x for x in granted if x[1] == "resourceclaims"] == [
        ("resource.k8s.io", "resourceclaims", "get")
    ]
    assert [x for x in granted if x[2] == "delete"] == [
        ("resource.k8s.io", "resourceslices", "delete")
    ]
    assert [x for x in granted if x[1] == "namespaces"] == [("", "namespaces", "get")]
    plain = _granted(chart.render().get("ClusterRole", "gpushare-node-agent"))
    assert not [x for x in plain if x[0] == "resource.k8s.io" or x[1] == "namespaces"]


def test_every_pools_daemonset_may_be_read_by_its_agents(chart: Chart) -> None:
    pools = [{"name": "dra", "mode": "dra", "nodeSelector": {"gpushare.io/mode": "dra"}}]
    role = chart.render({"node": {"extraPools": pools}}).get("Role", "gpushare-node-agent")
    assert role["rules"][0]["resourceNames"] == ["gpushare-node-agent", "gpushare-node-agent-dra"]


def test_agents_check_scrapers_tokens_only_when_metrics_are_authenticated(chart: Chart) -> None:
    """monitoring.auth tokenreview (the default): the agent may ask the API server about a
    caller's token and rights (gpushare.kube.access) and is started so; none: neither."""
    for auth, reviews in (("tokenreview", True), (None, True), ("none", False)):
        values = {"monitoring": {"auth": auth}} if auth else {}
        rendered = chart.render(values)
        granted = {
            (g, r, v)
            for rule in rendered.get("ClusterRole", "gpushare-node-agent")["rules"]
            for g in rule.get("apiGroups", [])
            for r in rule["resources"]
            for v in rule["verbs"]
        }
        assert (("authentication.k8s.io", "tokenreviews", "create") in granted) is reviews
        assert (("authorization.k8s.io", "subjectaccessreviews", "create") in granted) is reviews
        ds = rendered.get("DaemonSet", "gpushare-node-agent")
        args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--metrics-auth={auth or 'tokenreview'}" in args
