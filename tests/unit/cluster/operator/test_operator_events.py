"""Events reach the operator through the one cluster state: a change of a governed GPU pod
reconciles its GpuShare; the standalone operator's Kopf handlers (nodes, pods, GpuShares) fill
the same view class the controller's watches fill, and inside the controller the operator
watches GpuShares only."""

import asyncio
from typing import Any

import kopf

from gpushare.api.names import ANN_SHARE
from gpushare.cluster.operator.handlers import build_registry
from gpushare.cluster.operator.reconcile import ShareReconciler
from gpushare.cluster.operator.settings import OperatorConfig
from gpushare.cluster.state.view import ClusterView
from tests.fixtures.builders import gpu, node_json, pod_json


def pod_body(name: str, *, share: str | None = None) -> dict[str, Any]:
    """A GPU pod of namespace ml (gpushare-scheduler), linked to ``share`` by annotation."""
    annotations = {ANN_SHARE: share} if share else {}
    return pod_json(name, namespace="ml", annotations=annotations, scheduled=True)


SHARE = {"metadata": {"name": "train", "namespace": "ml"}, "spec": {"fraction": "0.25"}}


class Recorded(ShareReconciler):
    """A reconciler whose kicks are recorded, not run."""

    def __init__(self, view: ClusterView, kicked: list[str]) -> None:
        super().__init__(
            config=OperatorConfig(),
            kube=None,  # type: ignore[arg-type]  # only kicks: nothing is read or written
            view=view,
            profiler=None,  # type: ignore[arg-type]
        )
        self.kicked = kicked

    def kick(self, key: str) -> None:
        self.kicked.append(key)


def reconciler(view: ClusterView, kicked: list[str]) -> ShareReconciler:
    return Recorded(view, kicked)


def test_events_of_a_governed_gpu_pod_reconcile_its_share_once_the_operator_runs() -> None:
    view = ClusterView()
    view.upsert_share(SHARE)
    kicked: list[str] = []
    operator = reconciler(view, kicked)
    view.upsert_pod(pod_body("early", share="train"))
    assert kicked == []  # no operator yet: the view is kept, nothing acts
    view.pod_listeners.append(operator.pod_changed)
    view.upsert_pod(pod_body("p", share="train"))
    view.upsert_pod(pod_body("other"))
    view.upsert_pod(pod_json("plain", namespace="ml"))  # no GPU: never governed
    view.delete_pod("ml/p")
    assert kicked == ["ml/train", "ml/train"]
    assert view.kept_pod("ml/p") is None


def test_a_relist_reconciles_nothing_by_itself() -> None:
    """A full list (a resync, a restarted watch) is no change of any pod: Kopf's timer
    reconciles every share anyway."""
    view = ClusterView()
    view.upsert_share(SHARE)
    kicked: list[str] = []
    view.pod_listeners.append(reconciler(view, kicked).pod_changed)
    view.replace_pods([pod_body("p", share="train")])
    assert kicked == []


def test_the_reconciler_acts_once_the_view_is_synced() -> None:
    view = ClusterView()
    operator = reconciler(view, [])
    assert not operator.synced.is_set()
    view.mark_synced()
    assert operator.synced.is_set()


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


def test_an_object_kopf_delivers_that_the_view_cannot_take_is_held_out_not_raised() -> None:
    """Issue #45: every watch feeds the view through the quarantine, Kopf's too. A GpuShare the
    view fails on (a bug: parsing is total) is held out with its Event and metric, and the
    share events after it still arrive."""
    operator = Operator(standalone=True)
    real = operator.view.upsert_share

    def failing(body: Any) -> Any:
        if body["metadata"]["name"] == "poison":
            raise ArithmeticError("a bug the fuzz did not find")
        return real(body)

    operator.view.upsert_share = failing  # type: ignore[method-assign]
    poison = {"metadata": {"name": "poison", "namespace": "ml", "uid": "u1"}, "spec": {}}
    operator.deliver("share_event", "ADDED", poison)
    operator.deliver("share_event", "ADDED", SHARE)
    (held,) = operator.view.quarantine.held()
    assert (held.kind, held.key) == ("GpuShare", "ml/poison") and "ArithmeticError" in held.error
    assert operator.view.share("ml/train") is not None and operator.kicked == ["ml/train"]
    assert operator.share_events == 2
