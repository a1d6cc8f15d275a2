"""The dashboards can be scoped to one Prometheus `cluster` and one scrape `job` (issue #66: a
platform team's Prometheus holds several clusters, or two gpushare releases): every dashboard
has both template variables (All by default, which also matches series without the label), and
every gpushare series a panel or a variable reads carries both matchers (dcgm-exporter's only
`cluster`: its job is its own). The queries still parse (promtool)."""

import json
import re
import subprocess
from pathlib import Path

import yaml

from tests.chart.test_prometheusrule import promtool
from tests.fixtures.prometheus import DASHBOARDS, panel_queries, substitute

SELECTOR = re.compile(r'(?<![\w"])((?:gpushare_[a-z0-9_]+)|(?:DCGM_FI_[A-Z0-9_]+))\b(\{[^}]*\})?')
CLUSTER = 'cluster=~"$cluster"'
JOB = 'job=~"$job"'


def boards() -> dict[str, dict[str, object]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def variable_queries(board: dict[str, object]) -> list[str]:
    out = []
    for v in board["templating"]["list"]:  # type: ignore[index]
        query = v.get("query")
        if v["type"] == "query" and v["name"] not in ("cluster", "job"):
            out.append(query["query"] if isinstance(query, dict) else query)
    return out


def test_every_dashboard_has_cluster_and_job_variables_defaulting_to_all() -> None:
    for name, board in boards().items():
        variables = {v["name"]: v for v in board["templating"]["list"]}  # type: ignore[index]
        for var in ("cluster", "job"):
            v = variables[var]
            assert v["includeAll"] and v["allValue"] == ".*" and v["multi"], (name, var)
            assert v["current"]["value"] == ["$__all"], (name, var)
            assert "gpushare_build_info" in v["query"]["query"], (name, var)
        assert CLUSTER in variables["job"]["query"]["query"]


def test_every_series_read_is_scoped_by_cluster_and_job() -> None:
    exprs = [e for _, _, e in panel_queries()]
    exprs += [q for board in boards().values() for q in variable_queries(board)]
    assert len(exprs) > 100
    for expr in exprs:
        found = SELECTOR.findall(expr)
        assert found, expr
        for name, matchers in found:
            assert CLUSTER in matchers, (name, expr)
            assert (JOB in matchers) is name.startswith("gpushare_"), (name, expr)


def test_the_scoped_queries_parse(tmp_path: Path) -> None:
    rules = [
        {"record": f"check:q{i}", "expr": substitute(e)}
        for i, (_, _, e) in enumerate(panel_queries())
    ]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    proc = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
