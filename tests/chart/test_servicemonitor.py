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


def test_series_keep_their_own_pod_labels_and_relabelings_pass_through(chart: Chart) -> None:
    """honorLabels: a per-pod series names the workload's namespace/pod, not the scraped
    gpushare pod's (kube-prometheus-stack would otherwise rename them exported_*)."""
    drop = {"action": "drop", "regex": "gpushare_exporter_.*", "sourceLabels": ["__name__"]}
    keep = {"action": "replace", "targetLabel": "cluster", "replacement": "east"}
    rendered = chart.render(
        {
            "monitoring": {
                "serviceMonitor": {
                    "relabelings": [keep],
                    "metricRelabelings": [drop],
                    "scrapeTimeout": "20s",
                }
            }
        },
        api_versions=[MONITORING],
    )
    for monitor in rendered.all("ServiceMonitor"):
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["honorLabels"] is True
        assert endpoint["relabelings"] == [keep]
        assert endpoint["metricRelabelings"][-1] == drop
        assert endpoint["scrapeTimeout"] == "20s"


def test_node_agent_series_get_dcgm_join_labels(chart: Chart) -> None:
    def joins(values: dict[str, object]) -> list[object]:
        monitor = chart.render(values, api_versions=[MONITORING]).get(
            "ServiceMonitor", "gpushare-node-agent"
        )
        return [
            (r["sourceLabels"], r["targetLabel"])
            for r in monitor["spec"]["endpoints"][0].get("metricRelabelings", [])
        ]

    assert joins({}) == [(["gpu_uuid"], "UUID"), (["gpu_index"], "gpu")]
    assert joins({"monitoring": {"serviceMonitor": {"dcgmJoinLabels": False}}}) == []
    controller = chart.render({}, api_versions=[MONITORING]).get(
        "ServiceMonitor", "gpushare-controller"
    )
    assert "metricRelabelings" not in controller["spec"]["endpoints"][0]


def test_misspelt_relabeling_key_is_refused(chart: Chart) -> None:
    err = chart.fails(
        {"monitoring": {"serviceMonitor": {"honourLabels": True}}}, api_versions=[MONITORING]
    )
    assert "honourLabels" in err


def test_scrapes_send_a_scraper_token_where_metrics_are_authenticated(chart: Chart) -> None:
    """monitoring.auth tokenreview (default): gpushare answers /metrics only to a token the API
    server vouches for, so both endpoints send the token of the chart's metrics-scraper
    ServiceAccount (allowed to get /metrics), through `authorization` from a token Secret the
    API server fills (never the deprecated bearerTokenFile; no credential in the render);
    with a scrape class, the class authenticates; with auth none, no token is sent."""
    rendered = chart.render({}, api_versions=[MONITORING])
    for monitor in rendered.all("ServiceMonitor"):
        (endpoint,) = monitor["spec"]["endpoints"]
        assert "bearerTokenFile" not in endpoint and "bearerTokenSecret" not in endpoint
        assert endpoint["authorization"] == {
            "type": "Bearer",
            "credentials": {"name": "gpushare-metrics-scraper-token", "key": "token"},
        }
    secret = rendered.get("Secret", "gpushare-metrics-scraper-token")
    assert secret["type"] == "kubernetes.io/service-account-token" and "data" not in secret
    assert secret["metadata"]["annotations"] == {
        "kubernetes.io/service-account.name": "gpushare-metrics-scraper"
    }
    assert rendered.has("ServiceAccount", "gpushare-metrics-scraper")
    binding = rendered.get("ClusterRoleBinding", "gpushare-metrics-scraper")
    assert binding["roleRef"]["name"] == "gpushare-metrics-reader"
    reader = rendered.get("ClusterRole", "gpushare-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    for values in (
        {"monitoring": {"serviceMonitor": {"scrapeClass": "own-token"}}},
        {"monitoring": {"auth": "none"}},
    ):
        other = chart.render(values, api_versions=[MONITORING])
        assert not other.has("Secret", "gpushare-metrics-scraper-token")
        for monitor in other.all("ServiceMonitor"):
            assert "authorization" not in monitor["spec"]["endpoints"][0]
    classed = chart.render(
        {"monitoring": {"serviceMonitor": {"scrapeClass": "own-token"}}}, api_versions=[MONITORING]
    )
    assert {m["spec"]["scrapeClass"] for m in classed.all("ServiceMonitor")} == {"own-token"}
    # Without the Prometheus Operator's API: no ServiceMonitor, no scraper either.
    assert not chart.render({}).has("ServiceAccount", "gpushare-metrics-scraper")
