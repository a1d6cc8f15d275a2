"""The uninstall clean-up script ships in a ConfigMap, byte for byte the chart's file."""

from tests.fixtures.helm_chart import CHART, Chart


def test_configmap_carries_the_script(chart: Chart) -> None:
    cm = chart.render().get("ConfigMap", "gpushare-lifecycle")
    assert cm["data"]["lifecycle.py"].rstrip("\n") == (
        (CHART / "files" / "lifecycle.py").read_text().rstrip("\n")
    )
    assert not chart.render({"uninstall": {"cleanupNodes": False}}).has(
        "ConfigMap", "gpushare-lifecycle"
    )


def test_script_compiles(chart: Chart) -> None:
    source = chart.render().get("ConfigMap", "gpushare-lifecycle")["data"]["lifecycle.py"]
    compile(source, "lifecycle.py", "exec")
