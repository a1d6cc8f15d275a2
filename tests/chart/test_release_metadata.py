"""What a platform team checks before adopting the chart (#46 item 10): the control plane's
pods are critical by default, images can be pinned by digest, the chart says where it comes
from, and it ships a README."""

import pytest
import yaml

from tests.fixtures.helm_chart import CHART, Chart, container

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("kind", "name"), [("controller", "controller"), ("scheduler", "kube-scheduler")]
)
def test_controller_and_scheduler_are_cluster_critical_by_default(
    chart: Chart, kind: str, name: str
) -> None:
    deploy = chart.render().get("Deployment", f"gpushare-{kind}")
    assert deploy["spec"]["template"]["spec"]["priorityClassName"] == "system-cluster-critical"
    plain = chart.render({kind: {"priorityClassName": ""}}).get("Deployment", f"gpushare-{kind}")
    assert "priorityClassName" not in plain["spec"]["template"]["spec"]


def test_images_pinned_by_digest_everywhere(chart: Chart) -> None:
    rendered = chart.render(
        {"image": {"digest": DIGEST}, "scheduler": {"image": {"tag": "v1.34.4", "digest": DIGEST}}}
    )
    images = {
        c["image"]
        for obj in rendered.objects
        if obj["kind"] in ("Deployment", "DaemonSet", "Job", "Pod")
        for spec in [obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]]
        for c in [*spec.get("initContainers", []), *spec["containers"]]
    }
    assert images == {
        f"gpushare/gpushare:0.1.0@{DIGEST}",
        f"registry.k8s.io/kube-scheduler:v1.34.4@{DIGEST}",
    }
    assert container(rendered.get("Deployment", "gpushare-controller"), "controller")["image"]
    assert "digest" in chart.fails({"image": {"digest": "latest"}})


def test_chart_metadata_and_readme() -> None:
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["home"].startswith("https://") and meta["sources"]
    assert meta["maintainers"] and meta["description"]
    readme = (CHART / "README.md").read_text()
    for needed in ("helm install", "gpushare.io/enabled", "GitOps", "Pod Security", "values"):
        assert needed in readme, needed
