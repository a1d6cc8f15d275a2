"""The controller Services: 443 (webhook, /metrics) on every replica for the API server, and
the extender port on the replica holding the Lease only, for the scheduler."""

from tests.fixtures.helm_chart import Chart


def test_ports_lead_to_the_named_container_ports(chart: Chart) -> None:
    rendered = chart.render()
    svc = rendered.get("Service", "gpushare-controller")
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]}
    assert ports == {"webhook": (443, "webhook")}
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "controller"
    assert "gpushare.io/controller-role" not in svc["spec"]["selector"]
    extender = rendered.get("Service", "gpushare-controller-extender")
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in extender["spec"]["ports"]}
    assert ports == {"extender": (8888, "extender")}


def test_the_extender_service_selects_only_the_leader(chart: Chart) -> None:
    """Only the leader binds: the standby labels itself standby and its extender port is
    closed, so the scheduler never reaches it."""
    extender = chart.render().get("Service", "gpushare-controller-extender")
    assert extender["spec"]["selector"]["gpushare.io/controller-role"] == "leader"
    assert extender["spec"]["selector"]["app.kubernetes.io/component"] == "controller"


def test_cluster_ip_can_be_pinned_for_clusters_without_dns(chart: Chart) -> None:
    rendered = chart.render({"controller": {"service": {"clusterIP": "10.96.88.88"}}})
    pinned = rendered.get("Service", "gpushare-controller-extender")
    assert pinned["spec"]["clusterIP"] == "10.96.88.88"
    assert "clusterIP" not in chart.render().get("Service", "gpushare-controller-extender")["spec"]
