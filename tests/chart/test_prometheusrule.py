"""The chart's alerts (monitoring.prometheusRule), each run by Prometheus's own rule engine:
``promtool test rules`` over the rules exactly as the chart renders them, with series shaped as
gpushare's collectors and the ServiceMonitors' scrape jobs make them. Each alert fires on its
failure, with the labels and text a user gets, and none fires on a healthy cluster.

The Prometheus Operator selecting and loading the rule in a real Prometheus is
tests/cluster/test_monitoring_operator.py.
"""

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import REPO
from tests.fixtures.helm_chart import Chart

NS = "gpushare-system"
CTL = 'job="gpushare-controller"'
AGENT = 'job="gpushare-node-agent"'
API = ("monitoring.coreos.com/v1/PrometheusRule",)
G0 = "GPU-0"


def promtool() -> str:
    """promtool of the Prometheus the harness builds (hack/build-tools.sh), else the system's."""
    versions = (REPO / "hack" / "lib" / "versions.sh").read_text()
    match = re.search(r'PROMETHEUS_VERSION="\$\{PROMETHEUS_VERSION:-([^}]+)\}"', versions)
    cache = Path.home() / ".cache" / "gpushare" / "bin"
    if match and (cache / f"prometheus-{match.group(1)}" / "promtool").is_file():
        return str(cache / f"prometheus-{match.group(1)}" / "promtool")
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool not found: hack/build-tools.sh prometheus-operator builds it")
    return found


def rendered_rule(chart: Chart, values: dict[str, Any] | None = None) -> dict[str, Any]:
    rendered = chart.render(
        {"monitoring": {"prometheusRule": {"enabled": True, **(values or {})}}},
        api_versions=API,
    )
    return rendered.get("PrometheusRule", "gpushare")


def alerts(rule: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def expanded(rule: dict[str, Any], labels: dict[str, str]) -> dict[str, str]:
    """The annotations as Prometheus expands them for an alert with ``labels``."""
    return {
        k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], v)
        for k, v in rule["annotations"].items()
    }


# Per alert: the series that make it fire, when it is evaluated, and the labels the alert
# carries besides alertname and severity.
FIRING: dict[str, tuple[list[dict[str, str]], str, dict[str, str]]] = {
    "GpushareControllerDown": (
        [{"series": f'up{{{CTL}, namespace="{NS}", instance="a"}}', "values": "0x15"}],
        "10m",
        {},
    ),
    "GpushareNoLeader": (
        [{"series": f'up{{{CTL}, namespace="{NS}", instance="a"}}', "values": "1x15"}],
        "10m",
        {},
    ),
    "GpushareControllerViewNotSynced": (
        [{"series": f'gpushare_controller_view_synced{{{CTL}, instance="a"}}', "values": "0x20"}],
        "15m",
        {},
    ),
    "GpushareWebhookErrors": (
        [
            {
                "series": f'gpushare_webhook_requests_total{{{CTL}, webhook="mutate", '
                'outcome="error", instance="a"}',
                "values": "0+3x20",
            }
        ],
        "15m",
        {},
    ),
    "GpushareWebhookSlow": (
        [
            {
                "series": f"gpushare_webhook_request_duration_seconds_bucket{{{CTL}, "
                f'webhook="mutate", le="{le}", instance="a"}}',
                "values": f"0+{n}x30",
            }
            for le, n in (("0.5", 0), ("1.0", 0), ("2.0", 10), ("+Inf", 10))
        ],
        "20m",
        {},
    ),
    "GpushareExtenderErrors": (
        [
            {
                "series": f'gpushare_extender_requests_total{{{CTL}, verb="bind", '
                'outcome="error", instance="a"}',
                "values": "0+1x20",
            }
        ],
        "15m",
        {"verb": "bind"},
    ),
    "GpushareBindFailures": (
        [
            {
                "series": f'gpushare_extender_binds_total{{{CTL}, result="failed", instance="a"}}',
                "values": "0 0 0 1 1 1",
            }
        ],
        "5m",
        {},
    ),
    "GpushareExtenderSlow": (
        [
            {
                "series": f"gpushare_extender_request_duration_seconds_bucket{{{CTL}, "
                f'verb="filter", le="{le}", instance="a"}}',
                "values": f"0+{n}x30",
            }
            for le, n in (("0.5", 0), ("1.0", 0), ("5.0", 10), ("+Inf", 10))
        ],
        "20m",
        {"verb": "filter"},
    ),
    "GpusharePodsPending": (
        [
            {
                "series": f'gpushare_pending_pods{{{CTL}, namespace="team-a", instance="a"}}',
                "values": "1x30",
            }
        ],
        "20m",
        {"namespace": "team-a"},
    ),
    "GpushareObjectsQuarantined": (
        [
            {
                "series": f'gpushare_controller_quarantined_objects{{{CTL}, kind="Pod", '
                'instance="a"}',
                "values": "1x20",
            }
        ],
        "15m",
        {"kind": "Pod"},
    ),
    "GpushareNodeAgentDown": (
        [
            {
                "series": f'up{{{AGENT}, namespace="{NS}", instance="10.0.0.1:9445"}}',
                "values": "0x10",
            }
        ],
        "10m",
        {"job": "gpushare-node-agent", "namespace": NS, "instance": "10.0.0.1:9445"},
    ),
    "GpushareNodeAgentNotReady": (
        [
            {
                "series": f'gpushare_gpu_info{{{AGENT}, node="n1", gpu_uuid="{G0}"}}',
                "values": "1x20",
            },
            {
                "series": f'gpushare_deviceplugin_healthy_gpus{{{AGENT}, node="n1"}}',
                "values": "0x20",
            },
        ],
        "15m",
        {"node": "n1"},
    ),
    "GpushareMpsDaemonDown": (
        [
            {
                "series": f'gpushare_mps_daemon_up{{{AGENT}, node="n1", gpu_uuid="{G0}"}}',
                "values": "0x10",
            }
        ],
        "10m",
        {"job": "gpushare-node-agent", "node": "n1", "gpu_uuid": G0},
    ),
    "GpushareGpuUnhealthy": (
        [
            {
                "series": f'gpushare_gpu_healthy{{{AGENT}, node="n1", gpu_uuid="{G0}"}}',
                "values": "1 1 0 0 0 0",
            }
        ],
        "5m",
        {"job": "gpushare-node-agent", "node": "n1", "gpu_uuid": G0},
    ),
    "GpushareMpsClientFaults": (
        [
            {
                "series": f'gpushare_mps_fault_incidents_total{{{AGENT}, node="n1", '
                f'gpu_uuid="{G0}", attributed="yes"}}',
                "values": "0 0 0 1 1 1",
            }
        ],
        "5m",
        {"node": "n1", "gpu_uuid": G0},
    ),
    "GpushareExporterStale": (
        [
            {
                "series": f'gpushare_exporter_sample_age_seconds{{{AGENT}, node="n1", '
                f'gpu_uuid="{G0}"}}',
                "values": "300x20",
            }
        ],
        "15m",
        {"node": "n1", "gpu_uuid": G0},
    ),
}

HEALTHY = [
    {"series": f'up{{{CTL}, namespace="{NS}", instance="a"}}', "values": "1x40"},
    {"series": f'up{{{CTL}, namespace="{NS}", instance="b"}}', "values": "1x40"},
    {"series": f'gpushare_controller_view_synced{{{CTL}, instance="a"}}', "values": "1x40"},
    {
        "series": f'gpushare_webhook_requests_total{{{CTL}, webhook="mutate", '
        'outcome="allowed", instance="a"}',
        "values": "0+5x40",
    },
    *[
        {
            "series": f"gpushare_webhook_request_duration_seconds_bucket{{{CTL}, "
            f'webhook="mutate", le="{le}", instance="a"}}',
            "values": "0+5x40",
        }
        for le in ("0.01", "0.5", "+Inf")
    ],
    {
        "series": f'gpushare_extender_requests_total{{{CTL}, verb="bind", outcome="ok", '
        'instance="a"}',
        "values": "0+5x40",
    },
    *[
        {
            "series": f"gpushare_extender_request_duration_seconds_bucket{{{CTL}, "
            f'verb="bind", le="{le}", instance="a"}}',
            "values": "0+5x40",
        }
        for le in ("0.01", "0.5", "+Inf")
    ],
    {
        "series": f'gpushare_extender_binds_total{{{CTL}, result="bound", instance="a"}}',
        "values": "0+5x40",
    },
    {
        "series": f'gpushare_pending_pods{{{CTL}, namespace="team-a", instance="a"}}',
        "values": "0x40",
    },
    {"series": f'up{{{AGENT}, namespace="{NS}", instance="10.0.0.1:9445"}}', "values": "1x40"},
    {"series": f'gpushare_gpu_info{{{AGENT}, node="n1", gpu_uuid="{G0}"}}', "values": "1x40"},
    {"series": f'gpushare_deviceplugin_healthy_gpus{{{AGENT}, node="n1"}}', "values": "1x40"},
    {"series": f'gpushare_mps_daemon_up{{{AGENT}, node="n1", gpu_uuid="{G0}"}}', "values": "1x40"},
    {"series": f'gpushare_gpu_healthy{{{AGENT}, node="n1", gpu_uuid="{G0}"}}', "values": "1x40"},
    {
        "series": f'gpushare_mps_fault_incidents_total{{{AGENT}, node="n1", gpu_uuid="{G0}", '
        'attributed="yes"}',
        "values": "0x40",
    },
    {
        "series": f'gpushare_exporter_sample_age_seconds{{{AGENT}, node="n1", gpu_uuid="{G0}"}}',
        "values": "2x40",
    },
]


def run_promtool(tmp_path: Path, rule: dict[str, Any], tests: list[dict[str, Any]]) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump(
            {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests},
            sort_keys=False,
        )
    )
    binary = promtool()
    checked = subprocess.run(
        [binary, "check", "rules", "rules.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    proc = subprocess.run(
        [binary, "test", "rules", "tests.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_rule_unless_asked_or_without_the_operator(chart: Chart) -> None:
    assert not chart.render(api_versions=API).all("PrometheusRule")
    enabled = {"monitoring": {"prometheusRule": {"enabled": True}}}
    assert not chart.render(enabled).all("PrometheusRule")  # the cluster serves no CRD


def test_every_alert_fires_on_its_failure(chart: Chart, tmp_path: Path) -> None:
    rule = rendered_rule(chart, {"additionalRuleLabels": {"team": "gpu"}})
    rules = alerts(rule)
    assert set(rules) == set(FIRING), "every alert has a firing case, and only those"
    tests = []
    for name, (series, at, labels) in FIRING.items():
        severity = rules[name]["labels"]["severity"]
        assert severity in ("warning", "critical")
        assert rules[name]["annotations"]["runbook_url"].endswith(f"#{name.lower()}")
        tests.append(
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": at,
                        "alertname": name,
                        "exp_alerts": [
                            {
                                "exp_labels": {**labels, "severity": severity, "team": "gpu"},
                                "exp_annotations": expanded(rules[name], labels),
                            }
                        ],
                    }
                ],
            }
        )
    run_promtool(tmp_path, rule, tests)


def test_a_healthy_cluster_fires_nothing(chart: Chart, tmp_path: Path) -> None:
    rule = rendered_rule(chart)
    tests = [
        {
            "interval": "1m",
            "input_series": HEALTHY,
            "alert_rule_test": [
                {"eval_time": at, "alertname": name, "exp_alerts": []}
                for name in alerts(rule)
                for at in ("10m", "30m")
            ],
        }
    ]
    run_promtool(tmp_path, rule, tests)


def test_thresholds_follow_the_timeouts_they_guard(chart: Chart) -> None:
    rules = alerts(
        chart.render(
            {
                "monitoring": {"prometheusRule": {"enabled": True}},
                "webhook": {"timeoutSeconds": 10},
                "scheduler": {"extenderTimeoutSeconds": 30},
            },
            api_versions=API,
        ).get("PrometheusRule", "gpushare")
    )
    assert rules["GpushareWebhookSlow"]["expr"].rstrip().endswith("> 2")
    assert rules["GpushareExtenderSlow"]["expr"].rstrip().endswith("> 6")
