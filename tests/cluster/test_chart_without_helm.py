"""The chart as Argo CD runs it (issue #66): rendered with ``helm template``, its hooks left out
(Argo CD runs none of the chart's Helm delete hooks), applied server-side wave by wave, then
deleted as Argo CD deletes an Application: in reverse sync-wave order, foreground, each wave
gone before the next. No ``helm uninstall`` and no pre-delete hook: the node must still be as
clean as after ``helm uninstall`` (tests/cluster/test_chart_e2e.py): no gpushare label,
annotation, plugin socket, MPS directory or agent process, nothing of the release left, and the
GpuShare CRD kept (Argo CD's ``Delete=false``).
"""

import subprocess
from typing import Any

import pytest
import yaml

from tests.fixtures.chart_release import (
    NAMESPACE,
    RELEASE,
    check_nothing_left,
    component,
    exclusive_node,
    node,
    ready,
    release_pods,
    remove_release,
    wait_for,
)
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.helm_chart import CHART, KUBE_VERSION, LOCAL_VALUES, helm_binary

pytestmark = [pytest.mark.cluster, pytest.mark.whole_node]

WAVE = "argocd.argoproj.io/sync-wave"
HOOK = "helm.sh/hook"
Obj = dict[str, Any]


def rendered() -> list[Obj]:
    helm = helm_binary()
    if helm is None:
        pytest.skip("helm not found: build it with `hack/build-tools.sh helm`")
    out = subprocess.run(
        [
            helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds",
            "--kube-version", KUBE_VERSION, "--values", str(LOCAL_VALUES),
        ],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


def annotation(obj: Obj, key: str) -> str | None:
    return (obj["metadata"].get("annotations") or {}).get(key)


def waves(objects: list[Obj]) -> dict[int, list[Obj]]:
    """Argo CD's waves of the objects it applies (hooks are not applied)."""
    out: dict[int, list[Obj]] = {}
    for obj in objects:
        if annotation(obj, HOOK) is None:
            out.setdefault(int(annotation(obj, WAVE) or 0), []).append(obj)
    return out


def manifest(objects: list[Obj]) -> str:
    return "\n---\n".join(yaml.safe_dump(o) for o in objects)


def test_applied_and_deleted_as_argo_cd_does_the_chart_leaves_the_node_clean(
    cluster: LocalCluster, images: None
) -> None:
    by_wave = waves(rendered())
    assert sorted(by_wave) == [0, 1]
    assert {o["kind"] for o in by_wave[1]} == {"DaemonSet"}
    with exclusive_node(cluster):
        remove_release(cluster)
        try:
            namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
            cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(namespace))  # CreateNamespace
            for wave in sorted(by_wave):
                cluster.kubectl(
                    "apply", "--server-side", "--field-manager=argocd-controller", "-f", "-",
                    input=manifest(by_wave[wave]),
                )  # fmt: skip
            wait_for(
                lambda: (
                    (agents := [p for p in release_pods(cluster) if component(p) == "node-agent"])
                    and all(ready(p) for p in agents)
                    and "gpushare.io/mps-capable" in node(cluster)["metadata"]["labels"]
                ),
                timeout_s=300,
                what="the node agent Ready and the node labelled by it",
            )
            # The Application deleted: the highest wave first, each gone before the next; the
            # CRD is kept (Delete=false).
            for wave in sorted(by_wave, reverse=True):
                objects = [o for o in by_wave[wave] if o["kind"] != "CustomResourceDefinition"]
                cluster.kubectl(
                    "delete", "-f", "-", "--cascade=foreground", "--wait=true",
                    "--timeout=300s", "--ignore-not-found", input=manifest(objects),
                )  # fmt: skip
            cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=300s")
            check_nothing_left(cluster)
        finally:
            remove_release(cluster)
