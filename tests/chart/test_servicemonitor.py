"""ServiceMonitors exist only where the Prometheus Operator's CRD does."""

from tests.fixtures.helm_chart import Chart

MONITORING = "monitoring.coreos.com/v1/ServiceMonitor"


def test_none_without_the_crd(chart: Chart) -> None:
    assert not chart.render().all("ServiceMonitor")


def test_controller_and_agents_scraped_when_the_crd_exists(chart: Chart) -> None:
    rendered = chart.render(
        {"monitoring": {"serviceMonitor": {"interval": "15s", "labels": {"release": "prom"}}}},
        api_versions=[MONITORING],
    )
    monitors = {m["metadata"]["name"]: m for m in rendered.all("ServiceMonitor")}
    assert set(monitors) == {"gpushare-controller", "gpushare-node-agent"}
    for name, monitor in monitors.items():
        svc = rendered.get("Service", name)
        assert (
            monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        )
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}
        assert endpoint["interval"] == "15s"
        assert monitor["metadata"]["labels"]["release"] == "prom"


def test_can_be_turned_off_even_with_the_crd(chart: Chart) -> None:
    rendered = chart.render(
        {"monitoring": {"serviceMonitor": {"enabled": False}}}, api_versions=[MONITORING]
    )
    assert not rendered.all("ServiceMonitor")
