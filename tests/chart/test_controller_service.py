"""The controller Service: extender port for the scheduler, 443 for the API server."""

from tests.fixtures.helm_chart import Chart


def test_ports_lead_to_the_named_container_ports(chart: Chart) -> None:
    svc = chart.render().get("Service", "gpushare-controller")
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]}
    assert ports == {"extender": (8888, "extender"), "webhook": (443, "webhook")}
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "controller"


def test_cluster_ip_can_be_pinned_for_clusters_without_dns(chart: Chart) -> None:
    rendered = chart.render({"controller": {"service": {"clusterIP": "10.96.88.88"}}})
    assert rendered.get("Service", "gpushare-controller")["spec"]["clusterIP"] == "10.96.88.88"
    assert "clusterIP" not in chart.render().get("Service", "gpushare-controller")["spec"]
