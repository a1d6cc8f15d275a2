"""The chart as a whole: lints clean, its CRDs are the project's CRDs, versions agree."""

import tomllib

import yaml

from tests.fixtures.helm_chart import CHART, LOCAL_VALUES, REPO, Chart


def test_helm_lint_passes_with_defaults_and_local_values(chart: Chart) -> None:
    for args in ((), ("--values", str(LOCAL_VALUES)), ("--strict",)):
        proc = chart.lint(*args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "0 chart(s) failed" in proc.stdout


def test_chart_crds_are_the_projects_crds() -> None:
    """One source of truth: helm/gpushare/crds/ holds byte-identical copies of crds/.
    Fix a failure with: cp crds/*.yaml helm/gpushare/crds/"""
    top = {p.name: p.read_bytes() for p in (REPO / "crds").glob("*.yaml")}
    packaged = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert top, "no CRDs in crds/"
    assert packaged.keys() == top.keys(), "run: cp crds/*.yaml helm/gpushare/crds/"
    for name, data in top.items():
        assert packaged[name] == data, f"helm/gpushare/crds/{name} differs from crds/{name}"


def test_app_version_is_the_package_version() -> None:
    """The default image tag is appVersion, which hack/build-image.sh tags from pyproject."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]


def test_every_template_has_its_own_test_file() -> None:
    tests = {p.name for p in (REPO / "tests" / "chart").glob("test_*.py")}
    for template in (CHART / "templates").glob("*.yaml"):
        expected = "test_" + template.stem.replace("-", "_") + ".py"
        assert expected in tests, f"templates/{template.name} has no tests/chart/{expected}"


def test_renders_with_plain_helm_template_and_refuses_old_clusters(chart: Chart) -> None:
    """No --kube-version: Helm renders as v1.20.0, which the chart takes as "no cluster"; a
    real cluster older than 1.30 is refused with the reason."""
    offline = chart.render(kube_version=None)
    assert offline.has("Deployment", "gpushare-controller")
    assert offline.has("DaemonSet", "gpushare-node-agent")
    err = chart.fails({}, kube_version="1.29.4")
    assert "gpushare needs Kubernetes >= 1.30" in err and "v1.29.4" in err
    chart.render(kube_version="1.30.0")


def test_plain_helm_template_keeps_every_admission_policy(chart: Chart) -> None:
    """A pipeline that renders with no cluster and applies the result must get the same
    guards as `helm install`: the placement, host-path and node-agent policies and their
    bindings are rendered whatever version Helm assumes (the chart refuses clusters older than
    1.30, and every one it accepts serves admissionregistration.k8s.io/v1 policies)."""
    expected = {
        "gpushare-placement-annotations",
        "gpushare-host-paths",
        "gpushare-host-paths-others",
        "gpushare-node-agent-scope",
    }
    for kube_version in (None, "1.30.0", "1.34.4"):
        rendered = chart.render(kube_version=kube_version)
        for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
            names = {o["metadata"]["name"] for o in rendered.all(kind)}
            assert names == expected, (kube_version, kind, names)
            assert {o["apiVersion"] for o in rendered.all(kind)} == {
                "admissionregistration.k8s.io/v1"
            }


def test_every_pod_template_gets_the_image_pull_secrets(chart: Chart) -> None:
    rendered = chart.render({"imagePullSecrets": [{"name": "regcred"}]})
    workloads = [
        o for o in rendered.objects if o["kind"] in {"Deployment", "DaemonSet", "Job", "Pod"}
    ]
    assert {o["kind"] for o in workloads} >= {"Deployment", "DaemonSet", "Job"}
    for obj in workloads:
        spec = obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]
        assert spec.get("imagePullSecrets") == [{"name": "regcred"}], (
            f"{obj['kind']}/{obj['metadata']['name']} has no imagePullSecrets"
        )
