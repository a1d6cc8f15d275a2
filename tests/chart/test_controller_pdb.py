"""The controller's PodDisruptionBudget: a drain never takes every replica."""

from tests.fixtures.helm_chart import Chart


def test_keeps_one_replica_through_voluntary_disruptions(chart: Chart) -> None:
    pdb = chart.render().get("PodDisruptionBudget", "gpushare-controller")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "controller"


def test_none_for_a_single_replica_which_a_budget_would_make_undrainable(chart: Chart) -> None:
    rendered = chart.render({"controller": {"replicas": 1}})
    assert not rendered.all("PodDisruptionBudget")
