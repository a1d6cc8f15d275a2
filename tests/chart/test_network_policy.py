"""NetworkPolicies: the extender port only from gpushare-scheduler, the webhook port open (the
API server is no pod), the node agents' metrics port from the controller and metricsFrom."""

from tests.fixtures.helm_chart import Chart

KIND = "NetworkPolicy"


def test_only_the_scheduler_reaches_the_extender_port(chart: Chart) -> None:
    policy = chart.render().get(KIND, "gpushare-controller")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rules = {r["ports"][0]["port"]: r.get("from") for r in policy["spec"]["ingress"]}
    (peer,) = rules["extender"]
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "scheduler"
    assert rules["webhook"] is None  # any source: the API server calls from the host network
    assert set(rules) == {"extender", "webhook"}


def test_node_agents_answer_the_controller_and_the_configured_scrapers(chart: Chart) -> None:
    rendered = chart.render(
        {"networkPolicy": {"metricsFrom": [{"namespaceSelector": {"matchLabels": {"m": "p"}}}]}}
    )
    policy = rendered.get(KIND, "gpushare-node-agent")
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    components = [
        p["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for p in rule["from"]
        if "podSelector" in p
    ]
    assert components == ["controller"]
    assert {"namespaceSelector": {"matchLabels": {"m": "p"}}} in rule["from"]


def test_can_be_turned_off(chart: Chart) -> None:
    assert not chart.render({"networkPolicy": {"enabled": False}}).all(KIND)
