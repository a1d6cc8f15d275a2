"""Answers kept per node state: nodes in one state share them, a node that changes does not."""

from datetime import UTC, datetime

from gpushare.api.names import STATE_ALLOCATED
from gpushare.api.placement import Placement
from gpushare.cluster.extender.args import ExtenderArgs, parse_extender_args
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.state.view import ClusterView
from gpushare.packing.mix import PodMix
from gpushare.packing.model import Demand
from tests.fixtures.builders import GIB, gpu, node_json, pod_json

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def on(uuid: str, percent: int) -> Placement:
    return Placement((uuid,), percent, 8 * GIB, NOW, STATE_ALLOCATED)


def cluster(nodes: int = 6) -> Extender:
    """``nodes`` nodes of one GPU each, every GPU 70 % taken: all in one state."""
    view = ClusterView(clock=lambda: NOW, mix=PodMix(refit_every=4))
    view.replace_nodes([node_json(f"n{i}", [gpu(f"G{i}")]) for i in range(nodes)])
    view.replace_pods(
        [
            pod_json(f"t{i}", fraction="0.7", node=f"n{i}", placement=on(f"G{i}", 70))
            for i in range(nodes)
        ]
    )
    return Extender(view=view, writer=None)


def ask(ext: Extender, pod: dict[str, object], names: list[str]) -> dict[str, object]:
    args: ExtenderArgs = parse_extender_args({"Pod": pod, "NodeNames": names})
    return ext.filter(args)


def test_nodes_in_one_state_share_one_answer_and_one_reason() -> None:
    ext = cluster()
    names = [f"n{i}" for i in range(6)]
    result = ask(ext, pod_json("big", fraction="0.5"), names)
    failed = result["FailedNodes"]
    assert isinstance(failed, dict) and set(failed) == set(names)
    assert len(set(failed.values())) == 1  # one line in the pod's event
    assert "needs 50 percent compute free" in next(iter(failed.values()))
    states = {ext.answers.state(n, ext.view.node_version(n)) for n in names}
    assert len(states) == 1 and None not in states


def test_a_node_that_changes_is_answered_afresh() -> None:
    ext = cluster()
    names = [f"n{i}" for i in range(6)]
    assert ask(ext, pod_json("small", fraction="0.3"), names)["NodeNames"] == names
    # n3's tenant leaves: 100 % free there, the others keep their answer.
    ext.view.delete_pod("default/t3")
    result = ask(ext, pod_json("big", fraction="0.5"), names)
    assert result["NodeNames"] == ["n3"]
    assert set(result["FailedNodes"]) == set(names) - {"n3"}


def test_a_refit_of_the_mix_moves_costs_but_not_no_fit() -> None:
    ext = cluster(3)
    demand = ext._intern(Demand(percent=30, tenancy="default"))
    answer = ext.answers.answer("n0", demand)
    assert answer is not None
    before = ext.answers.cost(answer, "n0", demand)
    assert before is not None and answer.cost_holds(ext.placer.version)
    for _ in range(4):  # the view's mix refits after 4 pods
        ext.view.mix.observe(Demand(percent=100))
    assert not answer.cost_holds(ext.placer.version)
    big = ext._intern(Demand(percent=50, tenancy="default"))
    no_fit = ext.answers.answer("n0", big)
    assert no_fit is not None and ext.answers.cost(no_fit, "n0", big) is None
    for _ in range(8):
        ext.view.mix.observe(Demand(percent=10))
    assert no_fit.cost_holds(ext.placer.version)  # "does not fit" holds across refits
