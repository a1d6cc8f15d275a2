"""Accounting cannot change after placement: a bound pod keeps counting for the share it was
placed with even where the chart's admission policy is missing (issue: a running 90 % pod patched
to gpu-fraction 0.01 made its GPU count as 1 % used and a 50 % pod was placed beside it)."""

from datetime import UTC, datetime

from gpushare.api.names import STATE_ALLOCATED
from gpushare.api.placement import Placement
from gpushare.cluster.extender.args import parse_extender_args
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.state.view import ClusterView
from tests.fixtures.builders import GIB, gpu, node_json, pod_json

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_patched_down_request_does_not_free_its_gpu() -> None:
    view = ClusterView(clock=lambda: NOW)
    view.replace_nodes([node_json("n0", [gpu("G0")])])
    placed = Placement(("G0",), 90, 60 * GIB, NOW, STATE_ALLOCATED)
    big = pod_json("big", fraction="0.9", node="n0", placement=placed, phase="Running")
    view.replace_pods([big])
    g = view.gpu("G0")
    assert g is not None and g.used_percent == 90
    shrunk = pod_json("big", fraction="0.01", node="n0", placement=placed, phase="Running")
    view.upsert_pod(shrunk)
    assert g.used_percent == 90
    ext = Extender(view=view, writer=None)
    newcomer = pod_json("newcomer", fraction="0.5", scheduled=True)
    result = ext.filter(parse_extender_args({"Pod": newcomer, "NodeNames": ["n0"]}))
    assert result["NodeNames"] == []
    # A new pod of the same name (recreated) is a new placement: nothing is frozen for it.
    view.delete_pod("default/big")
    assert g.used_percent == 0
