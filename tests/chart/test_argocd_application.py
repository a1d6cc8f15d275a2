"""The chart under Argo CD (issue #66): the documented Application (deploy/argocd) renders the
chart with valid values, the CRD is kept when the Application goes, and the node agents are
deleted first, so their preStop clean-up needs no Helm pre-delete hook. What Argo CD's deletion
leaves on a node: tests/cluster/test_chart_without_helm.py."""

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.fixtures.helm_chart import CHART, REPO, Chart
from tests.fixtures.scripts import load_script

APPLICATION = REPO / "deploy" / "argocd" / "application.yaml"
WAVE = "argocd.argoproj.io/sync-wave"


def application() -> dict[str, Any]:
    app: dict[str, Any] = yaml.safe_load(APPLICATION.read_text())
    return app


def test_the_application_installs_this_chart_with_values_it_accepts(chart: Chart) -> None:
    app = application()
    assert app["kind"] == "Application" and app["apiVersion"] == "argoproj.io/v1alpha1"
    source = app["spec"]["source"]
    assert (REPO / source["path"]) == CHART and (CHART / "Chart.yaml").is_file()
    values = source["helm"]["valuesObject"]
    values["image"]["repository"] = values["image"]["repository"].replace("<registry>", "reg")
    rendered = chart.render(values, release=source["helm"]["releaseName"])
    agent = rendered.get("DaemonSet", "gpushare-node-agent")
    assert agent["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.deploy.client"]
    sync = app["spec"]["syncPolicy"]
    assert {"CreateNamespace=true", "ServerSideApply=true"} <= set(sync["syncOptions"])
    labels = sync["managedNamespaceMetadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert "resources-finalizer.argocd.argoproj.io" in app["metadata"]["finalizers"]
    # What the controller writes at run time is left out of the diff.
    ignored = {d["kind"]: d for d in app["spec"]["ignoreDifferences"]}
    assert set(ignored) == {
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "Deployment",
    }
    assert ignored["Deployment"]["name"] == "gpushare-scheduler"


@pytest.mark.parametrize(
    "crd",
    [REPO / "crds" / "gpushare.io_gpushares.yaml", CHART / "crds" / "gpushare.io_gpushares.yaml"],
)
def test_the_crd_outlives_the_release_and_the_application(crd: Path) -> None:
    annotations = yaml.safe_load(crd.read_text())["metadata"]["annotations"]
    assert annotations["helm.sh/resource-policy"] == "keep"
    options = annotations["argocd.argoproj.io/sync-options"].split(",")
    assert {"Delete=false", "Prune=false"} <= set(options)


def test_the_node_agents_are_deleted_a_wave_before_the_rest(chart: Chart) -> None:
    values = {
        "node": {
            "backend": "nvml",
            "extraPools": [{"name": "dra", "mode": "dra", "nodeSelector": {"pool": "dra"}}],
        }
    }
    rendered = chart.render(values)
    daemonsets = rendered.all("DaemonSet")
    assert len(daemonsets) == 4  # two pools, each with its agents and MPS daemons
    assert {d["metadata"]["annotations"][WAVE] for d in daemonsets} == {"1"}
    others = [
        o
        for o in rendered.objects
        if o["kind"] != "DaemonSet" and WAVE in (o["metadata"].get("annotations") or {})
    ]
    assert others == []  # everything else in wave 0: deleted after the agents are gone


def _lifecycle() -> ModuleType:
    return load_script(CHART / "files" / "lifecycle.py", "lifecycle")


@pytest.mark.parametrize(
    ("status", "body", "removal"),
    [
        (200, {"metadata": {}}, False),  # a restart
        (200, {"metadata": {"deletionTimestamp": "2026-11-27T00:00:00Z"}}, True),
        (404, {}, True),
        (401, {}, True),  # the ServiceAccount is gone
        (403, {}, True),  # its binding is gone: Argo CD or kubectl delete -f, all at once
        (500, {}, False),
    ],
)
def test_the_agents_hook_knows_a_removal_without_the_pre_delete_hook(
    monkeypatch: pytest.MonkeyPatch, status: int, body: dict[str, Any], removal: bool
) -> None:
    hook = _lifecycle()
    monkeypatch.setenv("POD_NAMESPACE", "gpushare-system")
    monkeypatch.setenv("DAEMONSET_NAME", "gpushare-node-agent")
    monkeypatch.setattr(hook, "api", lambda *_a, **_k: (status, body))
    assert hook.uninstalling() is removal
