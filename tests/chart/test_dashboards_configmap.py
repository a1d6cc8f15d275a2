"""Every dashboard in helm/gpushare/dashboards/ becomes a ConfigMap the Grafana sidecar loads."""

import json

from tests.fixtures.helm_chart import CHART, Chart


def test_one_labelled_configmap_per_dashboard_file(chart: Chart) -> None:
    files = sorted((CHART / "dashboards").glob("*.json"))
    assert files, "no dashboards in helm/gpushare/dashboards/"
    maps = chart.render().all("ConfigMap")
    by_file = {k: cm for cm in maps for k in cm["data"] if k.endswith(".json")}
    assert set(by_file) == {f.name for f in files}
    for f in files:
        cm = by_file[f.name]
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"]["grafana_folder"] == "gpushare"
        assert json.loads(cm["data"][f.name]) == json.loads(f.read_text())


def test_label_namespace_and_switch_follow_values(chart: Chart) -> None:
    maps = chart.render(
        {
            "dashboards": {
                "label": "dash",
                "labelValue": "yes",
                "namespace": "monitoring",
                "folder": "",
                "folderAnnotation": "k8s-sidecar-target-directory",
            }
        }
    ).all("ConfigMap")
    dashboards = [cm for cm in maps if any(k.endswith(".json") for k in cm["data"])]
    assert dashboards
    for cm in dashboards:
        assert cm["metadata"]["labels"]["dash"] == "yes"
        assert cm["metadata"]["namespace"] == "monitoring"
        assert "annotations" not in cm["metadata"]
    off = chart.render({"dashboards": {"enabled": False}}).all("ConfigMap")
    assert not [cm for cm in off if any(k.endswith(".json") for k in cm["data"])]


def test_folder_annotation_key_follows_the_sidecars_setting(chart: Chart) -> None:
    maps = chart.render({"dashboards": {"folderAnnotation": "k8s-sidecar-target-directory"}}).all(
        "ConfigMap"
    )
    dashboards = [cm for cm in maps if any(k.endswith(".json") for k in cm["data"])]
    assert dashboards
    for cm in dashboards:
        assert cm["metadata"]["annotations"] == {"k8s-sidecar-target-directory": "gpushare"}
