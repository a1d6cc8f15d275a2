"""The node agents' headless Service: one endpoint per agent, on its metrics port."""

from tests.fixtures.helm_chart import Chart


def test_headless_service_selects_the_agents(chart: Chart) -> None:
    rendered = chart.render({"node": {"metrics": {"port": 19400}}})
    svc = rendered.get("Service", "gpushare-node-agent")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": 19400, "targetPort": "metrics", "protocol": "TCP"}
    ]
    ds = rendered.get("DaemonSet", "gpushare-node-agent")
    assert svc["spec"]["selector"] == ds["spec"]["selector"]["matchLabels"]
