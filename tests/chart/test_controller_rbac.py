"""Controller RBAC: exactly the verbs the extender, webhook registration and operator use."""

from tests.fixtures.helm_chart import Chart

Rule = tuple[str, str, str, str]


def _rules(role: dict) -> set[Rule]:  # type: ignore[type-arg]
    out = set()
    for rule in role["rules"]:
        for group in rule.get("apiGroups", []):
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames", ["*"]):
                        out.add((group, resource, verb, name))
    return out


def test_cluster_role_grants_no_wildcards_no_secrets_no_deletes(chart: Chart) -> None:
    rules = _rules(chart.render().get("ClusterRole", "gpushare-controller"))
    assert rules, "no rules"
    for group, resource, verb, _ in rules:
        assert "*" not in (group, resource, verb)
        assert resource != "secrets"
        assert verb not in ("delete", "deletecollection", "escalate", "bind", "impersonate")


def test_what_the_controller_needs_is_granted(chart: Chart) -> None:
    rules = _rules(chart.render().get("ClusterRole", "gpushare-controller"))
    for needed in [
        ("", "pods", "watch", "*"),
        ("", "pods", "patch", "*"),
        ("", "pods/binding", "create", "*"),
        ("", "nodes", "watch", "*"),
        ("", "namespaces", "watch", "*"),
        ("gpushare.io", "gpushares/status", "patch", "*"),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "patch", "gpushare"),
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "patch", "gpushare"),
    ]:
        assert needed in rules, needed


def test_webhook_configurations_only_its_own(chart: Chart) -> None:
    rules = _rules(chart.render(release="blue").get("ClusterRole", "blue-gpushare-controller"))
    names = {n for g, _, _, n in rules if g == "admissionregistration.k8s.io"}
    assert names == {"blue-gpushare"}


def test_profile_cache_configmap_only_in_its_namespace(chart: Chart) -> None:
    rendered = chart.render()
    role = rendered.get("Role", "gpushare-controller")
    assert role["metadata"]["namespace"] == "gpushare-system"
    rules = _rules(role)
    assert ("", "configmaps", "patch", "gpushare-profile-cache") in rules
    own = {"gpushare-profile-cache", "gpushare-controller"}  # the cache, and the leader Lease
    # ... its certificate Secrets, and the scheduler it restarts when they change; beside
    # them it only reads (list, watch) the node agents' Leases of its namespace.
    certificates = {
        f"gpushare-controller-{s}" for s in ("ca", "webhook-tls", "extender-tls", "extender-client")
    }
    assert all(
        name in own | certificates | {"gpushare-scheduler"}
        for _, resource, verb, name in rules
        if verb != "create" and (resource, verb) not in {("leases", "list"), ("leases", "watch")}
    )
    assert {n for _, r, _, n in rules if r == "secrets"} == certificates | {"*"}
    assert {v for _, r, v, n in rules if r == "secrets" and n == "*"} == {"create"}
    assert ("apps", "deployments", "patch", "gpushare-scheduler") in rules
    assert ("apps", "deployments", "patch", "gpushare-controller") not in rules
    assert ("coordination.k8s.io", "leases", "watch", "*") in rules
    assert not [r for r in rules if r[1] == "leases" and r[2] == "update" and r[3] == "*"]
    assert ("coordination.k8s.io", "leases", "update", "gpushare-controller") in rules
    binding = rendered.get("RoleBinding", "gpushare-controller")
    assert binding["subjects"][0]["name"] == "gpushare-controller"


def test_rbac_can_be_left_to_the_user(chart: Chart) -> None:
    rendered = chart.render({"rbac": {"create": False}})
    kinds = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    assert not [o for o in rendered.objects if o["kind"] in kinds]


CLAIM_PLACEMENT = [
    ("resource.k8s.io", "resourceclaims", "watch", "*"),
    ("resource.k8s.io", "resourceclaims", "patch", "*"),
    ("resource.k8s.io", "resourceclaims/status", "patch", "*"),
    ("resource.k8s.io", "resourceslices", "watch", "*"),
    ("resource.k8s.io", "deviceclasses", "get", "mps.gpushare.io"),
]


def test_claim_placement_is_granted_only_where_the_controller_places_claims(chart: Chart) -> None:
    def rules(values: dict) -> set[Rule]:  # type: ignore[type-arg]
        return _rules(chart.render(values).get("ClusterRole", "gpushare-controller"))

    placing = rules({"mode": "dra"})
    assert all(r in placing for r in CLAIM_PLACEMENT)
    mixed = {"node": {"extraPools": [{"name": "dra", "mode": "dra", "nodeSelector": {"p": "d"}}]}}
    assert all(r in rules(mixed) for r in CLAIM_PLACEMENT)  # a DRA pool beside the default
    for values in ({}, {"mode": "dra", "dra": {"placement": "kube-scheduler"}}):
        assert not any(
            r[0] == "resource.k8s.io" and r[1] != "resourceclaimtemplates" for r in rules(values)
        )


def test_in_mode_dra_the_one_delete_is_of_claim_templates(chart: Chart) -> None:
    """The controller makes, watches and deletes the claim templates of annotated pods (its
    own, once unused: gpushare.cluster.dra.templates); it may delete nothing else, and
    outside mode dra not even those."""
    rendered = chart.render({"mode": "dra", "dra": {"templatesPerNamespace": 7}})
    rules = _rules(rendered.get("ClusterRole", "gpushare-controller"))
    templates = {v for g, r, v, _ in rules if r == "resourceclaimtemplates"}
    assert templates == {"get", "list", "watch", "create", "delete"}
    assert {(r, v) for _, r, v, _ in rules if v == "delete"} == {
        ("resourceclaimtemplates", "delete")
    }
    args = rendered.get("Deployment", "gpushare-controller")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert "--dra-templates-per-namespace=7" in args
    assert not any(
        "templates-per-namespace" in a
        for a in chart.render().get("Deployment", "gpushare-controller")["spec"]["template"][
            "spec"
        ]["containers"][0]["args"]
    )


def test_metrics_are_read_only_by_callers_the_api_server_vouches_for(chart: Chart) -> None:
    """Issue #45: /metrics named every namespace's GpuShares to anyone. By default the
    controller checks a caller's token (TokenReview, SubjectAccessReview), reads the agents'
    /profile with a token of audience gpushare.io/node-agent, and the chart offers a
    metrics-reader ClusterRole (get /metrics), bound to monitoring.metricsReaders."""
    prometheus = {"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}
    rendered = chart.render({"monitoring": {"metricsReaders": [prometheus]}})
    role = rendered.get("ClusterRole", "gpushare-controller")
    rules = _rules(role)
    assert ("authentication.k8s.io", "tokenreviews", "create", "*") in rules
    assert ("authorization.k8s.io", "subjectaccessreviews", "create", "*") in rules
    assert {"nonResourceURLs": ["/profile"], "verbs": ["get"]} in role["rules"]
    reader = rendered.get("ClusterRole", "gpushare-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    binding = rendered.get("ClusterRoleBinding", "gpushare-metrics-reader")
    assert binding["subjects"] == [prometheus]
    assert binding["roleRef"]["name"] == "gpushare-metrics-reader"
    deployment = rendered.get("Deployment", "gpushare-controller")
    pod = deployment["spec"]["template"]["spec"]
    assert "--metrics-auth=tokenreview" in pod["containers"][0]["args"]
    token = next(v for v in pod["volumes"] if v["name"] == "node-agent-token")
    source = token["projected"]["sources"][0]["serviceAccountToken"]
    assert source["audience"] == "gpushare.io/node-agent"
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "node-agent-token")
    assert (
        f"{mount['mountPath']}/{source['path']}" == "/var/run/secrets/gpushare.io/node-agent/token"
    )
    assert not chart.render().has("ClusterRoleBinding", "gpushare-metrics-reader")


def test_open_metrics_grant_no_reviews(chart: Chart) -> None:
    rendered = chart.render({"monitoring": {"auth": "none"}})
    rules = _rules(rendered.get("ClusterRole", "gpushare-controller"))
    assert not [r for r in rules if r[1] in ("tokenreviews", "subjectaccessreviews")]
    assert not rendered.has("ClusterRole", "gpushare-metrics-reader")
    pod = rendered.get("Deployment", "gpushare-controller")["spec"]["template"]["spec"]
    assert "--metrics-auth=none" in pod["containers"][0]["args"]
    assert all(v["name"] != "node-agent-token" for v in pod["volumes"])
