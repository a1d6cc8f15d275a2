"""The controller's view: rebuilt from pod annotations alone, freed by finished or deleted pods,
and never oversubscribed by reservations."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from gpushare.api.names import ANN_MEMORY, STATE_ALLOCATED, STATE_ASSUMED
from gpushare.api.placement import Placement
from gpushare.cluster.state.reservations import ReservationError
from gpushare.cluster.state.view import ClusterView
from gpushare.packing.model import Assignment, Demand
from tests.fixtures.builders import GIB, gpu, node_json, pod_json

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def placed(
    uuid: str,
    percent: int,
    *,
    memory_gib: int = 10,
    state: str = STATE_ALLOCATED,
    at: datetime = NOW,
) -> Placement:
    return Placement((uuid,), percent, memory_gib * GIB, at, state)


def cluster_pods() -> list[dict[str, object]]:
    return [
        pod_json("a", fraction="0.5", node="n1", placement=placed("GPU-1", 50)),
        pod_json("b", fraction="0.25", node="n1", placement=placed("GPU-1", 25)),
        pod_json("c", fraction="0.3", node="n1", placement=placed("GPU-2", 30)),
        pod_json(
            "done", fraction="0.4", node="n1", placement=placed("GPU-2", 40), phase="Succeeded"
        ),
        pod_json(
            "crashed", fraction="0.4", node="n1", placement=placed("GPU-2", 40), phase="Failed"
        ),
        pod_json("pending", fraction="0.2"),
        pod_json("unrelated"),
    ]


def make_view(clock: datetime = NOW) -> ClusterView:
    view = ClusterView(clock=lambda: clock)
    view.replace_nodes([node_json("n1", [gpu("GPU-1"), gpu("GPU-2", index=1)])])
    view.replace_pods(cluster_pods())
    return view


def test_shares_come_from_placement_annotations_and_finished_pods_hold_none() -> None:
    view = make_view()
    node = view.node("n1")
    assert node is not None
    assert [g.used_percent for g in node.gpus] == [75, 30]
    assert [g.used_memory for g in node.gpus] == [20 * GIB, 10 * GIB]
    assert view.synced


def test_a_restart_rebuilds_the_same_view_whatever_the_order_of_events() -> None:
    first = make_view()
    second = ClusterView(clock=lambda: NOW)
    for pod in reversed(cluster_pods()):  # pods before their node's inventory
        second.upsert_pod(pod)
    second.upsert_node(node_json("n1", [gpu("GPU-1"), gpu("GPU-2", index=1)]))
    for a, b in zip(first.node("n1").gpus, second.node("n1").gpus, strict=True):  # type: ignore[union-attr]
        assert sorted(t.key for t in a.tenants) == sorted(t.key for t in b.tenants)
        assert a.used_percent == b.used_percent


def test_deleting_or_finishing_a_pod_frees_its_share() -> None:
    view = make_view()
    view.delete_pod("default/a")
    view.upsert_pod(
        pod_json("b", fraction="0.25", node="n1", placement=placed("GPU-1", 25), phase="Succeeded")
    )
    assert view.gpu("GPU-1").used_percent == 0  # type: ignore[union-attr]


def test_a_terminal_phase_written_over_running_containers_frees_nothing_until_they_stop() -> None:
    """#45: a tenant with pods/status patched its running pod to Succeeded; the kubelet stops
    it only at its next sync, and its share must count until then."""
    view = make_view()
    pod = pod_json("b", fraction="0.25", node="n1", placement=placed("GPU-1", 25), phase="Running")
    running = {"name": "main", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}
    pod["status"] = {"phase": "Succeeded", "containerStatuses": [running]}
    view.upsert_pod(pod)
    assert view.gpu("GPU-1").used_percent == 75  # type: ignore[union-attr]
    stopped = {"name": "main", "state": {"terminated": {"exitCode": 137}}}
    pod["status"] = {"phase": "Succeeded", "containerStatuses": [stopped]}
    view.upsert_pod(pod)
    assert view.gpu("GPU-1").used_percent == 50  # type: ignore[union-attr]


def test_a_relist_forgets_pods_that_vanished_during_a_watch_gap() -> None:
    view = make_view()
    view.replace_pods([p for p in cluster_pods() if p["metadata"]["name"] != "c"])  # type: ignore[index]
    assert view.gpu("GPU-2").used_percent == 0  # type: ignore[union-attr]
    assert view.pod("default/c") is None


def test_memory_of_a_placement_counts_at_its_limit() -> None:
    view = make_view()
    view.upsert_pod(
        pod_json(
            "m",
            fraction="0.1",
            annotations={ANN_MEMORY: "30Gi"},
            node="n1",
            placement=placed("GPU-2", 10, memory_gib=30),
        )
    )
    assert view.gpu("GPU-2").free_memory == 80 * GIB - 40 * GIB  # type: ignore[union-attr]


def test_reservations_never_oversubscribe_a_gpu() -> None:
    view = make_view()
    demand = Demand(percent=20)
    held = []
    for i in range(10):
        try:
            held.append(
                view.reserve(
                    key=f"default/r{i}",
                    uid=f"u{i}",
                    node="n1",
                    assignment=Assignment("n1", ("GPU-1",), 20, 16 * GIB),
                    demand=demand,
                    bind_time=NOW,
                )
            )
        except ReservationError:
            break
    assert len(held) == 1  # 75% + 20% fits, a second 20% would not
    assert view.gpu("GPU-1").used_percent == 95  # type: ignore[union-attr]
    view.release(held[0])
    assert view.gpu("GPU-1").used_percent == 75  # type: ignore[union-attr]


def test_reserving_a_gpu_that_is_not_on_the_node_fails() -> None:
    view = make_view()
    with pytest.raises(ReservationError, match="not on node"):
        view.reserve(
            key="default/x",
            uid="u",
            node="n1",
            assignment=Assignment("n1", ("GPU-9",), 10, GIB),
            demand=Demand(percent=10),
            bind_time=NOW,
        )


def test_a_reservation_hands_over_to_the_annotations_once_the_pod_is_bound() -> None:
    view = make_view()
    res = view.reserve(
        key="default/pending",
        uid="uid-default-pending",
        node="n1",
        assignment=Assignment("n1", ("GPU-2",), 20, 16 * GIB),
        demand=Demand(percent=20),
        bind_time=NOW,
    )
    assert view.gpu("GPU-2").used_percent == 50  # type: ignore[union-attr]
    annotated = Placement(("GPU-2",), 20, 16 * GIB, NOW, STATE_ASSUMED)
    # The watch first shows our annotations on the still-unbound pod: the hold stays.
    view.upsert_pod(pod_json("pending", fraction="0.2", placement=annotated))
    assert view.reservation("default/pending") is res
    view.upsert_pod(pod_json("pending", fraction="0.2", placement=annotated, node="n1"))
    assert view.reservation("default/pending") is None
    assert view.gpu("GPU-2").used_percent == 50  # type: ignore[union-attr]
    view.release(res)  # a late rollback of a hand-over reservation changes nothing
    assert view.gpu("GPU-2").used_percent == 50  # type: ignore[union-attr]


def test_a_placement_never_bound_stops_counting_after_the_stale_timeout() -> None:
    clock = [NOW]
    view = ClusterView(stale_assume_seconds=60, clock=lambda: clock[0])
    view.replace_nodes([node_json("n1", [gpu("GPU-1")])])
    view.replace_pods(
        [pod_json("orphan", fraction="0.5", placement=placed("GPU-1", 50, state=STATE_ASSUMED))]
    )
    assert view.gpu("GPU-1").used_percent == 50  # type: ignore[union-attr]
    clock[0] = NOW + timedelta(seconds=61)
    assert view.expire_stale() == ["default/orphan"]
    assert view.gpu("GPU-1").used_percent == 0  # type: ignore[union-attr]


def test_a_pod_does_not_compete_with_its_own_earlier_placement() -> None:
    view = make_view()
    view.upsert_pod(
        pod_json("again", fraction="0.7", placement=placed("GPU-2", 70, state=STATE_ASSUMED))
    )
    assert view.gpu("GPU-2").used_percent == 100  # type: ignore[union-attr]
    own = view.node_for("n1", "default/again")
    assert own is not None and own.gpus[1].used_percent == 30
    assert view.gpu("GPU-2").used_percent == 100  # type: ignore[union-attr]  # view untouched


def test_unreadable_inventory_is_reported_per_node() -> None:
    view = ClusterView()
    view.upsert_node({"metadata": {"name": "bad", "annotations": {"gpushare.io/gpus": "{"}}})
    assert view.node("bad") is None
    assert "gpushare.io/gpus" in (view.node_problem("bad") or "")


def test_largest_gpu_memory_tracks_inventory() -> None:
    view = ClusterView()
    view.upsert_node(node_json("n1", [gpu("G1", memory_gib=40), gpu("G2", index=1, memory_gib=80)]))
    assert view.max_gpu_memory == 80 * GIB
    view.upsert_node(node_json("n1", [gpu("G1", memory_gib=40)]))
    assert view.max_gpu_memory == 40 * GIB


def test_pods_waiting_for_their_allocate_are_tracked_per_node() -> None:
    """Binds to a node wait on this list: Allocate carries device IDs only, so the node agent
    can tell pods apart only when one at a time waits for it."""
    view = make_view()
    assumed = placed("GPU-2", 20, state=STATE_ASSUMED)
    view.upsert_pod(pod_json("w", fraction="0.2", node="n1", placement=assumed))
    assert view.awaiting_allocation("n1") == ["default/w"]
    assert view.awaiting_allocation("n1", exclude="default/w") == []
    res = view.reserve(
        key="default/pending",
        uid="uid-default-pending",
        node="n1",
        assignment=Assignment("n1", ("GPU-2",), 10, GIB),
        demand=Demand(percent=10),
        bind_time=NOW,
    )
    assert view.awaiting_allocation("n1") == ["default/pending", "default/w"]
    view.release(res)
    allocated = placed("GPU-2", 20, state=STATE_ALLOCATED)
    view.upsert_pod(pod_json("w", fraction="0.2", node="n1", placement=allocated))
    assert view.awaiting_allocation("n1") == []
    view.upsert_pod(pod_json("w", fraction="0.2", node="n1", placement=assumed, phase="Running"))
    assert view.awaiting_allocation("n1") == []
    view.upsert_pod(pod_json("w", fraction="0.2", node="n1", placement=assumed))
    view.delete_pod("default/w")
    assert view.awaiting_allocation("n1") == []


# ---- host CPU and memory, and the pod mix ------------------------------------------------------


def with_allocatable(node: dict[str, object], cpu: str, memory: str) -> dict[str, object]:
    node["status"] = {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}}
    return node


def requesting(cpu: str, memory: str) -> list[dict[str, object]]:
    return [
        {
            "name": "main",
            "image": "busybox",
            "resources": {"requests": {"cpu": cpu, "memory": memory}},
        }
    ]


def test_free_cpu_and_memory_count_every_pod_bound_there_gpushare_or_not() -> None:
    view = ClusterView(clock=lambda: NOW)
    view.replace_nodes([with_allocatable(node_json("n1", [gpu("GPU-1")]), "16", "64Gi")])
    view.replace_pods(
        [
            pod_json("gpu", fraction="0.5", node="n1", placement=placed("GPU-1", 50),
                     containers=requesting("4", "16Gi")),
            pod_json("web", node="n1", containers=requesting("2500m", "1Gi")),
            pod_json("elsewhere", node="n2", containers=requesting("8", "8Gi")),
            pod_json("pending", containers=requesting("8", "8Gi")),
            pod_json("old", node="n1", phase="Succeeded", containers=requesting("8", "8Gi")),
        ]
    )  # fmt: skip
    node = view.node("n1")
    assert node is not None
    assert (node.cpu_milli_free, node.memory_free_bytes) == (9500, 47 * GIB)
    version = view.node_version("n1")
    view.delete_pod("default/web")
    assert (node.cpu_milli_free, node.memory_free_bytes) == (12000, 48 * GIB)
    assert view.node_version("n1") > version  # cached answers there are dropped
    # The pod itself does not count against the node it is already on (a retried bind).
    own = view.node_for("n1", "default/gpu")
    assert own is not None and own.cpu_milli_free == 16000


def test_a_hold_takes_host_resources_until_the_pod_is_seen_bound() -> None:
    view = ClusterView(clock=lambda: NOW)
    view.replace_nodes([with_allocatable(node_json("n1", [gpu("GPU-1")]), "16", "64Gi")])
    view.replace_pods([])
    demand = Demand(percent=0, gpus=0, cpu_milli=6000, host_memory_bytes=2 * GIB)
    view.reserve(
        key="default/cpu", uid="uid-default-cpu", node="n1",
        assignment=Assignment("n1", (), 0, 0), demand=demand, bind_time=NOW, hold_seconds=30,
    )  # fmt: skip
    node = view.node("n1")
    assert node is not None and node.cpu_milli_free == 10000
    # Nothing will wait for an Allocate: the bind gate ignores it.
    assert list(view.pending_on("n1")) == []
    view.upsert_pod(pod_json("cpu", node="n1", containers=requesting("6", "2Gi")))
    assert view.reservation("default/cpu") is None
    assert (node.cpu_milli_free, node.memory_free_bytes) == (10000, 62 * GIB)


def test_the_mix_counts_each_pod_once_as_it_arrives() -> None:
    view = ClusterView(clock=lambda: NOW)
    view.replace_nodes([node_json("n1", [gpu("GPU-1")])])
    gpu_pod = pod_json("g", fraction="0.25", containers=requesting("4", "8Gi"))
    routed = pod_json(
        "routed",
        containers=requesting("2", "1Gi"),
        extra_spec={"schedulerName": "gpushare-scheduler"},
    )
    other = pod_json("other", containers=requesting("1", "1Gi"))
    view.replace_pods([gpu_pod, routed, other])  # fmt: skip
    # A gpushare pod and a pod sent to gpushare-scheduler count when first seen; any other
    # pod only once bound to a node with gpushare GPUs (and once, whatever its updates).
    assert view.mix.observed == 2
    view.upsert_pod(gpu_pod)
    view.upsert_pod(pod_json("other", node="elsewhere", containers=requesting("1", "1Gi")))
    assert view.mix.observed == 2
    view.upsert_pod(pod_json("other", node="n1", containers=requesting("1", "1Gi")))
    assert view.mix.observed == 3
    counted = {s[:3] for s in view.mix.shapes()}
    assert counted == {(25, 1, 4000), (0, 0, 2000), (0, 0, 1000)}
    # A restarted controller counts the pods its first list returns.
    restarted = ClusterView(clock=lambda: NOW)
    restarted.replace_nodes([node_json("n1", [gpu("GPU-1")])])
    restarted.replace_pods([gpu_pod, routed])
    assert restarted.mix.observed == 2


def test_throw_away_pending_pods_leave_the_mix_as_it_was() -> None:
    """Issue 67: a tenant creating and deleting pending pods of an odd shape skewed the mix the
    gpushare policy measures against (openb allocation 95.50 -> 93.59%). A pod deleted before it
    was ever bound is taken back out of the mix; one seen bound keeps counting after it goes
    (it was demand that came); a pod replaced under the same name before it was bound counts
    once."""
    view = ClusterView(clock=lambda: NOW)
    view.replace_nodes([node_json("n1", [gpu("GPU-1")])])
    view.replace_pods([pod_json(f"job-{i}", fraction="0.5") for i in range(30)])
    honest = view.mix.shapes()
    for i in range(300):
        view.upsert_pod(pod_json(f"junk-{i}", namespace="tenant", fraction="0.07"))
    assert view.mix.shapes() != honest
    for i in range(300):
        view.delete_pod(f"tenant/junk-{i}")
    assert view.mix.shapes() == honest
    # The removals count towards the refits as arrivals do (as far apart: a churning tenant
    # cannot make the extender drop its kept answers any faster); by the next one the fitted
    # mix is the honest pods' alone.
    generation = view.mix.generation
    for i in range(30, 230):
        view.upsert_pod(pod_json(f"job-{i}", fraction="0.5"))
    assert view.mix.generation > generation
    assert {t.percent for t in view.mix.workload.tasks} == {50}

    # Bound before it went: it keeps counting.
    view.upsert_pod(pod_json("ran", fraction="0.25"))
    view.upsert_pod(pod_json("ran", fraction="0.25", node="n1", placement=placed("GPU-1", 25)))
    view.delete_pod("default/ran")
    assert sum(n for s, n in view.mix.shapes().items() if s[0] == 25) == 1
    # Replaced under the same name while pending (the deletion not seen): counted once.
    view.upsert_pod(pod_json("again", fraction="0.1", uid="first"))
    view.upsert_pod(pod_json("again", fraction="0.1", uid="second"))
    assert sum(n for s, n in view.mix.shapes().items() if s[0] == 10) == 1


def _labelled(name: str, product: str, model: str) -> dict[str, object]:
    node = node_json(name, [replace(gpu(f"{name}-GPU"), model=model)])
    node["metadata"]["labels"] = {"nvidia.com/gpu.product": product}  # type: ignore[index]
    return node


def _affinity(key: str, operator: str, values: list[str]) -> dict[str, object]:
    term = {"matchExpressions": [{"key": key, "operator": operator, "values": values}]}
    return {
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [term]
            }}
        }
    }  # fmt: skip


def test_the_mix_counts_the_gpu_models_a_pods_node_constraints_admit() -> None:
    """Issue 69: a pod limited to some GPU models by node affinity or node selector is counted
    with those models (read through the nodes' labels, whatever label it is), a pod every
    model admits without any; the mix prices models against the view's free capacity."""
    view = ClusterView(clock=lambda: NOW)
    view.replace_nodes(
        [
            _labelled("t4-a", "Tesla-T4", "Tesla T4"),
            _labelled("t4-b", "Tesla-T4", "Tesla T4"),
            _labelled("h100", "NVIDIA-H100", "NVIDIA H100 80GB HBM3"),
        ]
    )
    product = "nvidia.com/gpu.product"
    pods = [
        pod_json("t4", fraction="0.5", extra_spec=_affinity(product, "In", ["Tesla-T4"])),
        pod_json("not-t4", fraction="0.5", extra_spec=_affinity(product, "NotIn", ["Tesla-T4"])),
        pod_json("either", fraction="0.5", extra_spec=_affinity(product, "Exists", [])),
        pod_json("selector", fraction="1", extra_spec={"nodeSelector": {product: "NVIDIA-H100"}}),
        pod_json("free", fraction="0.25"),
        pod_json("nowhere", fraction="0.25", extra_spec={"nodeSelector": {product: "A100"}}),
    ]
    view.replace_pods(pods)
    models = {(s[0], s[3]) for s in view.mix.shapes()}
    assert models == {
        (50, "Tesla T4"),
        (50, "NVIDIA H100 80GB HBM3"),
        (50, None),
        (100, "NVIDIA H100 80GB HBM3"),
        (25, None),
    }
    assert view.mix.free_capacity is not None
    assert view.mix.free_capacity() == {"Tesla T4": 200, "NVIDIA H100 80GB HBM3": 100}
    # A pod bound to a T4 takes its share of the free capacity; a node gone takes all of its.
    view.upsert_pod(
        pod_json("bound", fraction="0.3", node="t4-a", placement=placed("t4-a-GPU", 30))
    )
    assert view.mix.free_capacity() == {"Tesla T4": 170, "NVIDIA H100 80GB HBM3": 100}
    view.delete_node("h100")
    assert view.mix.free_capacity() == {"Tesla T4": 170}
    view.upsert_node(_labelled("h100", "NVIDIA-H100", "NVIDIA H100 80GB HBM3"))
    # Relabelled, the T4 nodes admit nothing the pod asks for: it no longer counts a limit.
    view.upsert_node(_labelled("t4-a", "T4", "Tesla T4"))
    view.upsert_node(_labelled("t4-b", "T4", "Tesla T4"))
    view.upsert_pod(
        pod_json("t4", fraction="0.5", uid="new", extra_spec=_affinity(product, "In", ["Tesla-T4"]))
    )
    assert view.mix.observed == len(pods) + 2
    assert sum(n for s, n in view.mix.shapes().items() if s[:2] == (50, 1) and s[3] is None) == 2
