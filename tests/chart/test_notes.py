"""What NOTES.txt says after an install, for values an admin should be warned about (issue #66:
a values file that makes the host-path policy refuse other add-ons' pods names the value).

``helm template`` does not render NOTES.txt and ``helm install --dry-run`` needs a cluster, so
the chart is copied with its NOTES.txt also as a plain file that one extra template renders
through ``tpl`` with the same values: the text an install prints.
"""

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.helm_chart import CHART, Chart

PROBE = """apiVersion: v1
kind: ConfigMap
metadata:
  name: notes-probe
data:
  notes: {{ tpl (.Files.Get "notes-probe.txt") . | quote }}
"""


@pytest.fixture(scope="module")
def notes_chart(chart: Chart, tmp_path_factory: pytest.TempPathFactory) -> Chart:
    copy = tmp_path_factory.mktemp("chart") / "gpushare"
    shutil.copytree(CHART, copy)
    shutil.copy(CHART / "templates" / "NOTES.txt", copy / "notes-probe.txt")
    (copy / "templates" / "notes-probe.yaml").write_text(PROBE)
    return Chart(helm=chart.helm, path=Path(copy))


def notes(chart: Chart, values: dict[str, Any] | None = None) -> str:
    rendered = chart.render(values, show_only="templates/notes-probe.yaml")
    return str(rendered.get("ConfigMap", "notes-probe")["data"]["notes"])


def test_denying_other_pods_host_paths_is_warned_about_naming_the_value(notes_chart: Chart) -> None:
    quiet = notes(notes_chart)
    assert "gpushare" in quiet and "hostPathGuard" not in quiet
    assert "hostPathGuard" not in notes(notes_chart, {"hostPathGuard": {"otherPods": "off"}})
    values = {"hostPathGuard": {"otherPods": "deny", "exemptNamespaces": ["kube-system", "gpu-op"]}}
    text = notes(notes_chart, values)
    assert "WARNING hostPathGuard.otherPods=deny" in text
    assert "gpushare-system, kube-system, gpu-op" in text
    for addon in ("device plugin", "dcgm-exporter", "node-exporter", "/var/log"):
        assert addon in text, addon
    assert "hostPathGuard.exemptNamespaces" in text
    scoped = {"otherPods": "deny", "otherPodsNamespaceSelector": {"matchLabels": {"t": "x"}}}
    assert '{"matchLabels":{"t":"x"}}' in notes(notes_chart, {"hostPathGuard": scoped})
    off = {"hostPathGuard": {"enabled": False, "otherPods": "deny"}}
    assert "hostPathGuard" not in notes(notes_chart, off)
