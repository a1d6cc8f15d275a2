"""Pod events reach the operator through the one cluster state: a change of a governed GPU pod
reconciles its GpuShare."""

from typing import Any

from gpushare.api.names import ANN_SHARE
from gpushare.cluster.operator.reconcile import ShareReconciler
from gpushare.cluster.operator.settings import OperatorConfig
from gpushare.cluster.state.view import ClusterView
from tests.fixtures.builders import pod_json


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
