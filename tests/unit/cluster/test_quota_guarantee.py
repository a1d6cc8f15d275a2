"""Opting in keeps to the quota (issue 67): the webhook swaps an opted-in pod's request to
``gpushare.io/opportunistic-gpu-percent``, which a ResourceQuota on ``gpu-percent`` does not
count. On 6842a8c such a pod whose request fitted was bound, or promoted, as a guaranteed
share: a tenant at its 100% quota held 400% guaranteed and locked another tenant off the
node. Now it holds a guaranteed share only within every such quota of its namespace (and
never under Kueue, which admitted it by the opportunistic resource's quota); beyond, it runs
only opportunistically (which needs its measured profile) or waits, saying why."""

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from gpushare.api.names import (
    ANN_STATE,
    ANN_TIER,
    RESOURCE_GPU_OPPORTUNISTIC,
    STATE_ALLOCATED,
)
from gpushare.cluster.extender.args import BindingArgs, parse_extender_args
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.state.view import ClusterView
from gpushare.packing.model import Assignment
from gpushare.packing.opportunistic import Opportunism
from tests.fixtures.builders import PodStore, gpu, node_json, pod_json

NODE = "n1"
WHY = "ResourceQuota on gpushare.io/gpu-percent has no room for it as a guaranteed share"


def _quota(namespace: str, hard: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "gpus", "namespace": namespace},
        "spec": {"hard": {"requests.gpushare.io/gpu-percent": hard}},
    }


def _opted_in(name: str, namespace: str, percent: int, **labels: str) -> dict[str, Any]:
    """A pod as the webhook leaves an opted-in one: the opportunistic resource."""
    resources = {"limits": {RESOURCE_GPU_OPPORTUNISTIC: str(percent)}}
    pod = pod_json(
        name,
        namespace=namespace,
        fraction="1" if percent == 100 else f"0.{percent:02d}",
        containers=[{"name": "main", "image": "busybox", "resources": resources}],
        scheduled=True,
    )
    pod["metadata"]["labels"] = labels
    return pod


def _setup(*quotas: dict[str, Any]) -> tuple[ClusterView, PodStore, Extender]:
    view = ClusterView()
    view.replace_nodes([node_json(NODE, [gpu(f"G{i}", index=i) for i in range(4)])])
    view.replace_pods([])
    view.quotas.replace(quotas)
    store = PodStore()
    return view, store, Extender(view=view, writer=store, opportunism=Opportunism())


def _bind(view: ClusterView, store: PodStore, ext: Extender, pod: dict[str, Any]) -> str:
    """Filter then bind, as kube-scheduler does; the bound pod's tier, else why filter left
    it waiting."""
    store.add(pod)
    view.upsert_pod(pod)
    result = ext.filter(parse_extender_args({"Pod": pod, "NodeNames": [NODE]}))
    if NODE not in (result.get("NodeNames") or []):
        failed = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}
        return f"waits: {failed[NODE]}"
    meta = pod["metadata"]
    args = BindingArgs(meta["name"], meta["namespace"], meta["uid"], NODE)
    error = asyncio.run(ext.bind(args))["Error"]
    assert error == "", error
    bound = store.pods[f"{meta['namespace']}/{meta['name']}"]
    bound["metadata"]["annotations"][ANN_STATE] = STATE_ALLOCATED  # the node agent's Allocate
    view.upsert_pod(bound)
    return str(bound["metadata"]["annotations"].get(ANN_TIER, "guaranteed"))


def test_a_tenant_at_its_quota_gets_no_guaranteed_share_by_opting_in() -> None:
    view, store, ext = _setup(_quota("team-a", "100"))
    tiers = [_bind(view, store, ext, _opted_in(f"a{i}", "team-a", 100)) for i in range(4)]
    assert tiers[0] == "guaranteed"
    for tier in tiers[1:]:  # unprofiled: no opportunistic placement either
        assert tier.startswith("waits: ") and WHY in tier, tier
    assert view.guaranteed_in("team-a") == 100
    # Another tenant's guaranteed pod still finds room: the opportunistic ones give way.
    victim = pod_json("b0", namespace="team-b", fraction="1", scheduled=True)
    victim["spec"]["containers"][0]["resources"] = {"limits": {"gpushare.io/gpu-percent": "100"}}
    assert _bind(view, store, ext, victim) == "guaranteed"


def test_without_a_quota_an_opted_in_pod_that_fits_is_guaranteed_as_before() -> None:
    view, store, ext = _setup()
    tiers = [_bind(view, store, ext, _opted_in(f"a{i}", "team-a", 50)) for i in range(3)]
    assert tiers == ["guaranteed"] * 3


def test_guaranteed_pods_count_against_the_quota_first() -> None:
    """40 % asked as gpu-percent (the quota counted it) leaves 60 of a 100 quota."""
    view, store, ext = _setup(_quota("team-a", "100"))
    plain = pod_json("g", namespace="team-a", fraction="0.4", scheduled=True)
    plain["spec"]["containers"][0]["resources"] = {"limits": {"gpushare.io/gpu-percent": "40"}}
    assert _bind(view, store, ext, plain) == "guaranteed"
    assert _bind(view, store, ext, _opted_in("o1", "team-a", 60)) == "guaranteed"
    assert WHY in _bind(view, store, ext, _opted_in("o2", "team-a", 10))


def test_a_pod_under_kueue_is_never_guaranteed_by_the_opportunistic_resource() -> None:
    view, store, ext = _setup()
    pod = _opted_in("k", "team-a", 50, **{"kueue.x-k8s.io/queue-name": "team-a"})
    assert WHY in _bind(view, store, ext, pod)


def test_an_opportunistic_tenant_is_promoted_only_within_the_quota() -> None:
    """A bind that raced a new quota is held opportunistic (the view's reserve), and the
    promotion round's check (``may_guarantee``) keeps it so until the quota has room."""
    view, store, ext = _setup()
    assert _bind(view, store, ext, _opted_in("a0", "team-a", 100)) == "guaranteed"
    view.quotas.replace([_quota("team-a", "100")])
    pod = store.add(_opted_in("a1", "team-a", 100))
    view.upsert_pod(pod)
    demand, _ = Extender(view=view, writer=store)._read(pod)
    assert demand is not None
    assignment = Assignment(NODE, ("G1",), thread_percent=100, memory_limit_bytes=2**30)
    held = view.reserve(
        key="team-a/a1",
        uid="uid-team-a-a1",
        node=NODE,
        assignment=assignment,
        demand=replace(demand, guarantee=True),
        bind_time=datetime.now(UTC),
    )
    assert held.assignment.opportunistic
    assert not view.may_guarantee("team-a/a1")
    view.quotas.replace([_quota("team-a", "200")])
    assert view.may_guarantee("team-a/a1")


def test_an_unreadable_quota_bound_guarantees_nothing() -> None:
    view, store, ext = _setup(_quota("team-a", "lots"))
    assert view.quotas.hard("team-a") == 0
    assert WHY in _bind(view, store, ext, _opted_in("a", "team-a", 10))
