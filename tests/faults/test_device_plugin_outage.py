"""While a node's device plugin is gone (node agent killed or restarting), its kubelet rejects
every pod asking for gpushare.io/gpu-percent ("no healthy devices"), and a bare pod bound then
is lost. The extender therefore stops placing pods on a node whose kubelet reports no
allocatable slices, and places them again once the agent is back (found by the node-agent
fault in test_faults_cluster.py)."""

from typing import Any

from gpushare.api.names import RESOURCE_GPU_PERCENT
from gpushare.cluster.extender.args import ExtenderArgs
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.state.view import ClusterView
from tests.fixtures.builders import gpu, node_json, pod_json


def node(allocatable: str | None) -> dict[str, Any]:
    doc = node_json("n0", [gpu("G0"), gpu("G1", index=1)])
    if allocatable is not None:
        doc["status"] = {
            "capacity": {RESOURCE_GPU_PERCENT: "200"},
            "allocatable": {RESOURCE_GPU_PERCENT: allocatable},
        }
    return doc


def filter_n0(view: ClusterView) -> dict[str, Any]:
    args = ExtenderArgs(pod=pod_json("p", fraction="0.25"), node_names=["n0"], nodes=None)
    return Extender(view=view, writer=None).filter(args)


def test_no_pod_is_placed_on_a_node_whose_device_plugin_is_gone() -> None:
    view = ClusterView()
    view.replace_nodes([node("200")])
    view.replace_pods([])
    assert filter_n0(view)["NodeNames"] == ["n0"]
    view.upsert_node(node("0"))  # the kubelet lost the plugin: every device unhealthy
    result = filter_n0(view)
    assert result["NodeNames"] == []
    (reason,) = result["FailedAndUnresolvableNodes"].values()
    assert "node agent (device plugin) is not registered" in reason
    view.upsert_node(node("200"))  # the agent registered again
    assert filter_n0(view)["NodeNames"] == ["n0"]


def test_a_node_that_never_reported_allocatable_is_still_used() -> None:
    view = ClusterView()
    view.replace_nodes([node(None)])
    view.replace_pods([])
    assert filter_n0(view)["NodeNames"] == ["n0"]
