"""_helpers.tpl: every object is named after the release and labelled by one helper."""

from tests.fixtures.helm_chart import LOCAL_VALUES, Chart

RECOMMENDED = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/part-of",
    "helm.sh/chart",
)


def test_every_object_carries_the_recommended_labels(chart: Chart) -> None:
    rendered = chart.render(
        {"webhook": {"certManager": {"enabled": True}}},
        release="lab",
        values_files=[LOCAL_VALUES],
        api_versions=["monitoring.coreos.com/v1/ServiceMonitor"],
    )
    assert len(rendered.objects) > 30
    for obj in rendered.objects:
        labels = obj["metadata"].get("labels", {})
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        for key in RECOMMENDED:
            assert key in labels, f"{where} lacks {key}"
        assert labels["app.kubernetes.io/instance"] == "lab", where
        assert labels["app.kubernetes.io/managed-by"] == "Helm", where
        assert labels["app.kubernetes.io/name"] == "gpushare", where
        assert "app.kubernetes.io/component" in labels, where


def test_pod_templates_carry_the_labels_their_selectors_match(chart: Chart) -> None:
    rendered = chart.render()
    workloads = rendered.all("Deployment") + rendered.all("DaemonSet")
    assert len(workloads) == 4  # controller, scheduler, node agent, MPS daemons
    for obj in workloads:
        selector = obj["spec"]["selector"]["matchLabels"]
        pod_labels = obj["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= pod_labels.items(), obj["metadata"]["name"]
        assert (
            obj["metadata"]["labels"]["app.kubernetes.io/component"]
            == selector["app.kubernetes.io/component"]
        )


def test_names_follow_the_release(chart: Chart) -> None:
    assert chart.render(release="gpushare").has("Deployment", "gpushare-controller")
    assert chart.render(release="prod").has("Deployment", "prod-gpushare-controller")
    assert chart.render({"fullnameOverride": "gs"}, release="x").has("DaemonSet", "gs-node-agent")


def test_common_labels_reach_every_object(chart: Chart) -> None:
    rendered = chart.render({"commonLabels": {"team": "ml-platform"}})
    assert all(o["metadata"]["labels"].get("team") == "ml-platform" for o in rendered.objects)


def test_two_releases_in_one_cluster_share_no_cluster_scoped_name(chart: Chart) -> None:
    cluster_scoped = {
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }

    def names(release: str) -> set[tuple[str, str]]:
        rendered = chart.render(release=release, namespace=release)
        return {
            (o["kind"], o["metadata"]["name"])
            for o in rendered.objects
            if o["kind"] in cluster_scoped
        }

    first, second = names("a"), names("b")
    assert len(first) >= 8
    assert not first & second
