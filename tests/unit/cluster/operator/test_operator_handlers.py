"""Kopf's events feed the one cluster state: the standalone operator's node, pod and GpuShare
handlers fill the same view class the controller's watches fill, and inside the controller
the operator watches GpuShares only."""

import asyncio
from typing import Any

import kopf

from gpushare.api.names import ANN_SHARE
from gpushare.cluster.operator.handlers import build_registry
from gpushare.cluster.operator.settings import OperatorConfig
from gpushare.cluster.state.view import ClusterView
from tests.fixtures.builders import gpu, node_json, pod_json
from tests.unit.cluster.operator.test_operator_pod_events import Recorded

SHARE = {"metadata": {"name": "train", "namespace": "ml"}, "spec": {"fraction": "0.25"}}


class Operator:
    """The registry's watching handlers over one view, kicks recorded (as ``run_operator``
    wires them: the reconciler listens to the view's pod events)."""

    def __init__(self, *, standalone: bool) -> None:
        self.view = ClusterView()
        self.kicked: list[str] = []
        self.share_events = 0
        reconciler = Recorded(self.view, self.kicked)
        self.view.pod_listeners.append(reconciler.pod_changed)
        registry = build_registry(
            config=OperatorConfig(),
            view=self.view,
            reconciler=reconciler,
            watch_nodes_and_pods=standalone,
            on_share_event=self._share_event,
        )
        self.handlers: dict[str, Any] = {
            h.id.rsplit(".", 1)[-1]: h.fn for h in registry._watching.get_all_handlers()
        }

    def _share_event(self) -> None:
        self.share_events += 1

    def deliver(self, handler: str, kind: str, body: dict[str, Any]) -> None:
        event: Any = {"type": kind, "object": body}
        asyncio.run(self.handlers[handler](event=event, body=kopf.Body(body)))  # type: ignore[arg-type]


def test_inside_the_controller_kopf_watches_gpushares_only() -> None:
    assert sorted(Operator(standalone=False).handlers) == ["share_event"]


def test_standalone_node_events_give_the_gpu_models_the_operator_reads() -> None:
    operator = Operator(standalone=True)
    body = node_json("n1", [gpu("G0")])
    operator.deliver("node_event", "ADDED", body)
    assert operator.view.gpu_model("n1", "G0") is not None
    operator.deliver("node_event", "DELETED", body)
    assert operator.view.node_info("n1") is None


def test_share_events_fill_the_view_and_reconcile_the_share() -> None:
    operator = Operator(standalone=False)
    operator.deliver("share_event", "ADDED", SHARE)
    assert operator.view.share("ml/train") is not None
    assert operator.view.share_request("ml", "train") is not None  # the webhook's lookup
    assert operator.kicked == ["ml/train"]
    operator.deliver("share_event", "DELETED", SHARE)
    assert operator.view.share("ml/train") is None
    assert operator.kicked == ["ml/train"]  # a deleted share is released, not reconciled
    assert operator.share_events == 2  # the controller hands its GpuShare watch over on these


def test_standalone_pod_events_of_a_governed_pod_reconcile_its_share() -> None:
    operator = Operator(standalone=True)
    operator.deliver("share_event", "ADDED", SHARE)
    pod = pod_json("p", namespace="ml", annotations={ANN_SHARE: "train"}, scheduled=True)
    operator.deliver("pod_event", "ADDED", pod)
    operator.deliver("pod_event", "ADDED", pod_json("plain", namespace="ml"))
    operator.deliver("pod_event", "DELETED", pod)
    assert operator.kicked == ["ml/train", "ml/train", "ml/train"]
    assert operator.view.kept_pod("ml/p") is None
