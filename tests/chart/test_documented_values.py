"""Every `--set` the docs show is one the chart takes (issue #66: chart.md showed
`--set node.nodeSelector.nvidia\\.com/gpu\\.present=true`, which the schema refuses: `--set`
makes `true` a boolean; `--set-string` is what works). The snippets are read out of the docs,
so a new one is tested too; those naming an agent flag (`--set-exclusive-process`) or another
tool's option are not chart values."""

import re
import shlex
import subprocess

import pytest
import yaml

from tests.fixtures.helm_chart import CHART, KUBE_VERSION, REPO, Chart

DOCS = [REPO / "README.md", CHART / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SNIPPET = re.compile(r"`([^`\n]*--set(?:-string|-json)?[ =][^`\n]*)`")


def documented() -> list[tuple[str, list[str]]]:
    found = []
    for doc in DOCS:
        for match in SNIPPET.finditer(doc.read_text()):
            words = shlex.split(match.group(1))
            args = []
            for i, word in enumerate(words):
                if word in ("--set", "--set-string", "--set-json") and i + 1 < len(words):
                    args += [word, words[i + 1]]
            if args:
                found.append((f"{doc.name}: {match.group(1)}", args))
    return found


def test_the_docs_show_set_snippets() -> None:
    snippets = [where for where, _ in documented()]
    assert any("nodeSelector" in s for s in snippets), snippets
    assert any("podRuntimeClassName" in s for s in snippets), snippets


@pytest.mark.parametrize(("where", "args"), documented(), ids=lambda v: str(v)[:60])
def test_each_documented_set_renders(chart: Chart, where: str, args: list[str]) -> None:
    proc = subprocess.run(
        [chart.helm, "template", "gpushare", str(CHART), "--kube-version", KUBE_VERSION, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, f"{where}\n{proc.stderr}"
    if "nodeSelector" in where:
        # It does what the doc says: the old selector back, the new one gone.
        agents = [
            d
            for d in yaml.safe_load_all(proc.stdout)
            if d and d["kind"] == "DaemonSet" and d["metadata"]["name"] == "gpushare-node-agent"
        ]
        selector = agents[0]["spec"]["template"]["spec"]["nodeSelector"]
        assert selector == {"nvidia.com/gpu.present": "true"}, selector


def test_a_boolean_node_selector_value_is_refused_naming_it(chart: Chart) -> None:
    err = chart.fails({"node": {"nodeSelector": {"nvidia.com/gpu.present": True}}})
    assert "nodeSelector" in err and "nvidia.com~1gpu.present" in err


def test_a_numeric_dashboard_label_value_set_on_the_command_line_is_a_string_label(
    chart: Chart,
) -> None:
    """`--set dashboards.labelValue=1` (what kube-prometheus-stack's sidecar looks for) gives
    the number 1: taken, and rendered as the label string "1"."""
    proc = subprocess.run(
        [chart.helm, "template", "gpushare", str(CHART), "--kube-version", KUBE_VERSION,
         "--set", "dashboards.labelValue=1", "--show-only", "templates/dashboards-configmap.yaml"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    maps = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert maps and {m["metadata"]["labels"]["grafana_dashboard"] for m in maps} == {"1"}
