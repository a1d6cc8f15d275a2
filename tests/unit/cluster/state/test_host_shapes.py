"""The view tells the pod mix what kinds of node each GPU model has (GPUs, allocatable CPU and
memory), so that pods only some models' nodes can hold make those models scarce
(gpushare.packing.scarcity; docs/packing.md, "Results")."""

from dataclasses import replace
from typing import Any

from gpushare.cluster.state.view import ClusterView
from tests.fixtures.builders import GIB, gpu, node_json, pod_json


def node(name: str, model: str, gpus: int, cpu: str, memory: str) -> dict[str, Any]:
    doc = node_json(name, [replace(gpu(f"{name}-{i}", index=i), model=model) for i in range(gpus)])
    doc["status"] = {"allocatable": {"cpu": cpu, "memory": memory}}
    return doc


def big_pod(i: int) -> dict[str, Any]:
    """8 whole GPUs and 120 CPUs: only the 128-CPU kind of node holds it."""
    resources = {"requests": {"cpu": "120", "memory": "700Gi"}}
    containers = [{"name": "main", "image": "busybox", "resources": resources}]
    return pod_json(f"big-{i}", fraction="8", containers=containers, scheduled=True)


def test_the_mix_learns_node_kinds_and_prices_the_only_model_that_holds_big_pods() -> None:
    view = ClusterView()
    view.replace_nodes(
        [node(f"g2-{i}", "G2", 8, "96", "384Gi") for i in range(6)]
        + [node("g3-0", "G3", 8, "128", "768Gi")]
    )
    assert view.mix.host_shapes is not None
    assert view.mix.host_shapes() == {
        "G2": frozenset({(8, 96_000, 384 * GIB)}),
        "G3": frozenset({(8, 128_000, 768 * GIB)}),
    }
    view.replace_pods(
        [big_pod(i) for i in range(3)]
        + [pod_json(f"p{i}", fraction="0.5", scheduled=True) for i in range(60)]
    )
    view.mix.refit()
    prices = view.mix.workload.prices
    assert set(prices) == {"G3"} and prices["G3"] > 0
    # A node that changes kind is read again: with a G2 node that holds them, the big pods are
    # limited to no model.
    view.upsert_node(node("g2-0", "G2", 8, "128", "768Gi"))
    assert (8, 128_000, 768 * GIB) in view.mix.host_shapes()["G2"]
    view.mix.refit()
    assert view.mix.workload.prices == {}
