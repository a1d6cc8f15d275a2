"""The PriorityClass opted-in pods are given (guaranteed pods go first in kube-scheduler's
queue, docs/packing.md "The sharing contract"): made with opportunistic placement, below the
default priority, never preempting; the controller is told its name and may read it."""

from gpushare.cluster.settings import parse_args
from tests.chart.controller_flags import parseable
from tests.fixtures.helm_chart import Chart, container


def _settings(chart: Chart, values: dict | None = None):  # type: ignore[no-untyped-def,type-arg]
    deploy = chart.render(values).get("Deployment", "gpushare-controller")
    return parse_args(parseable(container(deploy, "controller")["args"]))


def test_the_default_install_makes_a_low_never_preempting_class(chart: Chart) -> None:
    rendered = chart.render()
    (pc,) = rendered.all("PriorityClass")
    assert pc["metadata"]["name"] == "gpushare-opportunistic"
    assert pc["value"] == -10 and pc["preemptionPolicy"] == "Never"
    assert pc["globalDefault"] is False
    assert _settings(chart).opportunistic_priority_class == "gpushare-opportunistic"
    role = rendered.get("ClusterRole", "gpushare-controller")
    rule = next(r for r in role["rules"] if "priorityclasses" in r.get("resources", []))
    assert rule["resourceNames"] == ["gpushare-opportunistic"] and rule["verbs"] == ["get"]


def test_an_existing_class_can_be_named_instead(chart: Chart) -> None:
    values = {"controller": {"opportunistic": {"priorityClass": {"create": False, "name": "low"}}}}
    assert chart.render(values).all("PriorityClass") == []
    assert _settings(chart, values).opportunistic_priority_class == "low"


def test_without_opportunistic_placement_there_is_no_class(chart: Chart) -> None:
    values = {"controller": {"opportunistic": {"enabled": False}}}
    assert chart.render(values).all("PriorityClass") == []
    assert _settings(chart, values).opportunistic_priority_class == ""


def test_a_class_above_the_default_priority_is_refused(chart: Chart) -> None:
    err = chart.fails({"controller": {"opportunistic": {"priorityClass": {"value": 5}}}})
    assert "priorityClass" in err and "value" in err
