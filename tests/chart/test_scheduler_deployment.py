"""gpushare-scheduler: the official kube-scheduler image, matching the cluster's version."""

from tests.fixtures.helm_chart import Chart, container


def _deploy(chart: Chart, values: dict | None = None, **kw: str) -> dict:  # type: ignore[type-arg]
    return chart.render(values, **kw).get("Deployment", "gpushare-scheduler")


def test_image_tag_is_the_clusters_version_unless_set(chart: Chart) -> None:
    c = container(_deploy(chart, kube_version="1.31.2"), "kube-scheduler")
    assert c["image"] == "registry.k8s.io/kube-scheduler:v1.31.2"
    c = container(_deploy(chart, kube_version="1.34.4"), "kube-scheduler")
    assert c["image"] == "registry.k8s.io/kube-scheduler:v1.34.4"
    pinned = _deploy(chart, {"scheduler": {"image": {"tag": "v1.33.0"}}})
    assert container(pinned, "kube-scheduler")["image"] == "registry.k8s.io/kube-scheduler:v1.33.0"
    assert container(pinned, "kube-scheduler")["imagePullPolicy"] == "IfNotPresent"


def test_runs_the_mounted_config_as_non_root(chart: Chart) -> None:
    deploy = _deploy(chart)
    c = container(deploy, "kube-scheduler")
    assert c["command"][0] == "kube-scheduler"
    assert "--config=/etc/gpushare-scheduler/config.yaml" in c["command"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["config"] == "/etc/gpushare-scheduler"
    pod = deploy["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "gpushare-scheduler"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_a_config_change_rolls_the_scheduler(chart: Chart) -> None:
    def checksum(values: dict) -> str:  # type: ignore[type-arg]
        return _deploy(chart, values)["spec"]["template"]["metadata"]["annotations"][
            "checksum/config"
        ]

    assert checksum({}) == checksum({"controller": {"logLevel": "DEBUG"}})
    assert checksum({}) != checksum({"scheduler": {"extenderWeight": 9}})


def test_rendered_without_a_cluster_uses_the_tested_version_and_says_so(chart: Chart) -> None:
    """Plain `helm template` (Helm's offline v1.20.0) must not name kube-scheduler v1.20.0."""
    c = container(_deploy(chart, kube_version=None), "kube-scheduler")
    assert c["image"] == "registry.k8s.io/kube-scheduler:v1.34.4"
    text = chart._run(
        None,
        release="gpushare",
        namespace="gpushare-system",
        kube_version=None,
        api_versions=(),
        values_files=(),
        show_only="templates/scheduler-deployment.yaml",
    ).stdout
    assert "Set scheduler.image.tag (or render with --kube-version)" in text
    online = chart._run(
        None,
        release="gpushare",
        namespace="gpushare-system",
        kube_version="1.34.4",
        api_versions=(),
        values_files=(),
        show_only="templates/scheduler-deployment.yaml",
    ).stdout
    assert "Set scheduler.image.tag" not in online


def test_image_pull_secrets_reach_the_scheduler(chart: Chart) -> None:
    deploy = _deploy(chart, {"imagePullSecrets": [{"name": "regcred"}]})
    assert deploy["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
