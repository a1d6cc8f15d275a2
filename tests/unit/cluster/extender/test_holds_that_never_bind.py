"""A pod that passes filter and never binds no longer keeps GPUs from other tenants (issue
67): its filter-time hold was renewed on every retry. After MAX_LAPSED_HOLDS holds lapsed
without a bind, filter holds nothing more for it (it is still filtered, and may bind)."""

import time

from gpushare.cluster.extender.args import parse_extender_args
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.state.view import ClusterView
from gpushare.cluster.state.view_reserving import MAX_LAPSED_HOLDS
from tests.fixtures.builders import gpu, node_json, pod_json


def test_a_pod_whose_holds_keep_lapsing_gets_no_more_holds() -> None:
    view = ClusterView()
    view.replace_nodes([node_json("n1", [gpu("G0")])])
    stuck = pod_json("stuck", namespace="attacker", fraction="0.9", scheduled=True)
    view.replace_pods([stuck])
    ext = Extender(view=view, writer=None, hold_in_filter=True, hold_seconds=30.0)
    args = parse_extender_args({"Pod": stuck, "NodeNames": ["n1"]})
    for _ in range(MAX_LAPSED_HOLDS):
        assert ext.filter(args)["NodeNames"] == ["n1"]
        assert view.reservation("attacker/stuck") is not None  # held
        assert view.expire_holds(now=time.monotonic() + 60) == ["attacker/stuck"]
    assert ext.filter(args)["NodeNames"] == ["n1"]  # still placeable
    assert view.reservation("attacker/stuck") is None  # but holds nothing
    # Another tenant's pod finds the GPU free meanwhile.
    victim = pod_json("v", namespace="victim", fraction="0.5", scheduled=True)
    view.upsert_pod(victim)
    got = ext.filter(parse_extender_args({"Pod": victim, "NodeNames": ["n1"]}))
    assert got["NodeNames"] == ["n1"]
