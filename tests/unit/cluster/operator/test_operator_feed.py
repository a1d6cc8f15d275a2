"""The operator's picture of nodes and pods from the controller's watches (one watch per kind)."""

from typing import Any

from gpushare.cluster.operator.feed import OperatorFeed

from gpushare.api.names import ANN_SHARE
from tests.fixtures.builders import node_json, pod_json


def pod_body(name: str, *, share: str | None = None) -> dict[str, Any]:
    """A GPU pod of namespace ml (gpushare-scheduler), linked to ``share`` by annotation."""
    annotations = {ANN_SHARE: share} if share else {}
    return pod_json(name, namespace="ml", annotations=annotations, scheduled=True)


SHARE = {"metadata": {"name": "train", "namespace": "ml"}, "spec": {"fraction": "0.25"}}


def test_not_synced_until_nodes_and_pods_were_both_listed() -> None:
    feed = OperatorFeed()
    feed.nodes.replace([node_json("n1", None)])
    assert not feed.synced.is_set()  # a pod not listed yet must not read as deleted
    feed.pods.replace([pod_body("a"), pod_body("b")])
    assert feed.synced.is_set()
    assert sorted(feed.view.pods) == ["ml/a", "ml/b"]
    assert list(feed.view.nodes) == ["n1"]


def test_a_relist_forgets_what_went_away_while_the_watch_was_down() -> None:
    feed = OperatorFeed()
    feed.pods.replace([pod_body("a"), pod_body("b")])
    feed.pods.replace([pod_body("b")])
    assert list(feed.view.pods) == ["ml/b"]


def test_events_of_a_governed_gpu_pod_reconcile_its_share_once_the_operator_runs() -> None:
    feed = OperatorFeed()
    feed.view.put_share(SHARE)
    kicked: list[str] = []
    feed.pods.upsert(pod_body("early", share="train"))
    assert kicked == []  # no operator yet: the view is kept, nothing acts
    feed.kick = kicked.append
    feed.pods.upsert(pod_body("p", share="train"))
    feed.pods.upsert(pod_body("other"))
    feed.pods.upsert(pod_json("plain", namespace="ml"))  # no GPU: never governed
    feed.pods.delete(pod_body("p", share="train"))
    assert kicked == ["ml/train", "ml/train"]
    assert "ml/p" not in feed.view.pods


def test_node_events_update_the_gpu_models_the_operator_reads() -> None:
    feed = OperatorFeed()
    body: dict[str, Any] = node_json("n1", None)
    feed.nodes.upsert(body)
    assert feed.view.nodes["n1"].gpu_models == {}
    feed.nodes.delete(body)
    assert "n1" not in feed.view.nodes
