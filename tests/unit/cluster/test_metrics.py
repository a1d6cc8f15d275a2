"""The controller's series the dashboards read: pending gpushare pods per namespace, each
GpuShare's measured profile, and protection-eviction counters that exist (at 0) for every GPU
before the first eviction."""

import asyncio
from datetime import UTC, datetime

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import gpushare
from gpushare.api.profile import GpuProfile
from gpushare.cluster.admission.host import AdmissionProcess
from gpushare.cluster.main import ControllerContext
from gpushare.cluster.metrics import Metrics
from gpushare.cluster.operator.guard import LatencyGuard
from gpushare.cluster.operator.settings import OperatorConfig
from gpushare.cluster.settings import Settings
from gpushare.cluster.settings.serving import ProcessSettings
from gpushare.cluster.state.view import ClusterView
from tests.fixtures.builders import gpu, node_json, pod_json
from tests.unit.cluster.dra.helpers import allocated_claim, gated_pod, node_slice, share_claim
from tests.unit.cluster.dra.test_allocator import place, setup
from tests.unit.cluster.webhook.test_webhook_review import review_body


def samples(registry: CollectorRegistry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = generate_latest(registry).decode()
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def share(namespace: str, name: str, status: dict[str, object]) -> dict[str, object]:
    return {
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"fraction": "0.25"},
        "status": status,
    }


def test_pending_pods_count_unbound_gpushare_pods_per_namespace() -> None:
    view = ClusterView()
    view.replace_nodes([node_json("n1", [gpu("G0")])])
    view.replace_pods(
        [
            pod_json("wait-1", namespace="team-a", fraction="0.25"),
            pod_json("wait-2", namespace="team-a", fraction="0.5"),
            pod_json("wait-3", namespace="team-b", fraction="0.5"),
            pod_json("bound", namespace="team-a", fraction="0.25", node="n1", phase="Running"),
            pod_json("done", namespace="team-b", fraction="0.25", phase="Succeeded"),
            pod_json("plain", namespace="team-b"),  # not a gpushare pod
        ]
    )
    got = samples(Metrics(view).registry, "gpushare_pending_pods")
    assert got == {(("namespace", "team-a"),): 2.0, (("namespace", "team-b"),): 1.0}


def test_pods_a_queue_holds_gated_are_not_pending_for_gpushare() -> None:
    """A pod Kueue has not admitted yet carries Kueue's scheduling gate: it waits for quota,
    not for a GPU, and no FailedScheduling event would say why (docs/queues.md). Once the gate
    is removed it is pending like any other until bound."""
    view = ClusterView()
    view.replace_nodes([node_json("n1", [gpu("G0")])])
    kueue_gate = {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}
    view.replace_pods(
        [
            pod_json("queued", namespace="team-a", fraction="0.6", extra_spec=kueue_gate),
            pod_json("admitted", namespace="team-a", fraction="0.6"),
        ]
    )
    got = samples(Metrics(view).registry, "gpushare_pending_pods")
    assert got == {(("namespace", "team-a"),): 1.0}
    view.upsert_pod(pod_json("queued", namespace="team-a", fraction="0.6"))  # ungated
    got = samples(Metrics(view).registry, "gpushare_pending_pods")
    assert got == {(("namespace", "team-a"),): 2.0}


def test_share_profiles_are_exported_per_pipe_and_broken_ones_skipped() -> None:
    view = ClusterView()
    profile = GpuProfile(
        gpu_model="NVIDIA H100 80GB HBM3",
        fp16=0.1,
        fp32=0.3,
        fp64=0.0,
        tensor=0.6,
        sm_occupancy=0.4,
        dram_bandwidth=0.2,
        memory_used_bytes_max=2**30,
        sampled_seconds=30.0,
        time=datetime(2026, 1, 1, tzinfo=UTC),
        simulated=True,
        tensor_hmma=0.6,
    )
    view.replace_shares(
        [
            share("team-a", "trainer", {"phase": "Packed", "profile": profile.to_status()}),
            share("team-a", "waiting", {"phase": "Profiling"}),
            share("team-b", "broken", {"profile": {"gpuModel": "x", "fp32": 7}}),
        ]
    )
    got = samples(Metrics(view).registry, "gpushare_share_profile_pipe_ratio")
    by_pipe = {dict(k)["pipe"]: v for k, v in got.items()}
    assert by_pipe == {"fp16": 0.1, "fp32": 0.3, "fp64": 0.0, "tensor": 0.6, "tensor_hmma": 0.6}
    labels = dict(next(iter(got)))
    assert (labels["namespace"], labels["gpushare"], labels["simulated"]) == (
        "team-a",
        "trainer",
        "true",
    )


def test_protection_eviction_series_exist_at_zero_for_every_known_gpu() -> None:
    registry = CollectorRegistry()
    view = ClusterView()
    for name, gpus in (("n1", [gpu("G0"), gpu("G1", index=1)]), ("n2", [gpu("G2")])):
        view.upsert_node(node_json(name, gpus))
    guard = LatencyGuard(
        config=OperatorConfig(),
        kube=None,  # type: ignore[arg-type]  # no latency pod: nothing to read or evict
        view=view,
        profiler=None,  # type: ignore[arg-type]
        registry=registry,
    )
    assert asyncio.run(guard.tick()) == []
    got = samples(registry, "gpushare_protection_evictions_total")
    assert got == {
        (("gpu_uuid", "G0"), ("node", "n1")): 0.0,
        (("gpu_uuid", "G1"), ("node", "n1")): 0.0,
        (("gpu_uuid", "G2"), ("node", "n2")): 0.0,
    }
    view.delete_node("n2")
    asyncio.run(guard.tick())
    assert {
        dict(k)["gpu_uuid"] for k in samples(registry, "gpushare_protection_evictions_total")
    } == {
        "G0",
        "G1",
    }


async def test_dra_mode_reports_its_gpus_claims_and_placements() -> None:
    """A scrape in DRA mode: the slices' GPUs, the claims on them (one the controller placed,
    one kube-scheduler did) and the gpuPercent they consume; the view's GPU gauge stays the
    device-plugin nodes'."""
    allocator, kube, devices = setup(node_slice("n1", 2))
    devices.upsert_claim(
        allocated_claim("by-scheduler", device="gpu-1", consumed={"gpuPercent": "50"})
    )
    kube.create(share_claim("c1", percent="30"))
    allocator.pod_event(gated_pod("p1", claim="c1"))
    assert await place(allocator) == 1
    metrics = Metrics(allocator.view)
    metrics.watch_claims(allocator)
    reg = metrics.registry
    assert samples(reg, "gpushare_controller_dra_gpus") == {(): 2.0}
    assert samples(reg, "gpushare_controller_dra_claims") == {(): 2.0}
    assert samples(reg, "gpushare_controller_dra_allocated_percent") == {(): 80.0}
    assert samples(reg, "gpushare_dra_claims_placed_total") == {(): 1.0}
    assert samples(reg, "gpushare_dra_claims_left_to_scheduler_total") == {(): 0.0}
    assert samples(reg, "gpushare_controller_gpus") == {(): 0.0}
    # A gated pod whose claim has no room yet is pending, as an unbound annotated pod is.
    kube.create(share_claim("c2", percent="100"))
    kube.create(share_claim("c3", percent="100"))
    allocator.pod_event(gated_pod("p2", claim="c2"))
    allocator.pod_event(gated_pod("p3", claim="c3"))
    await place(allocator)
    assert samples(reg, "gpushare_pending_pods") == {(("namespace", "ns"),): 1.0}


CLUSTER_STATE = {
    "gpushare_controller_nodes",
    "gpushare_controller_gpus",
    "gpushare_controller_pods",
    "gpushare_controller_view_synced",
    "gpushare_pending_pods",
    "gpushare_share_profile_pipe_ratio",
    "gpushare_controller_quarantined_objects",
    "gpushare_controller_quarantined_total",
    "gpushare_opportunistic_pods",
}
"""The view's series: the same on every replica, so exported by the leader only."""


def _replica() -> ControllerContext:
    """One controller replica whose view holds one node and one pending gpushare pod (every
    replica watches the same cluster)."""
    view = ClusterView()
    view.replace_nodes([node_json("n1", [gpu("G0")])])
    view.replace_pods([pod_json("waiting", namespace="team-a", fraction="0.25")])
    view.mark_synced()
    settings = Settings(process=ProcessSettings(metrics_auth="none"))
    return ControllerContext(settings=settings, view=view, metrics=Metrics(view), kube=None)


async def _review_and_scrape(ctx: ControllerContext) -> str:
    """One admission review through the replica's webhook server (the admission process),
    then its /metrics (the port the ServiceMonitor scrapes on every replica)."""
    process = AdmissionProcess(ctx, host="127.0.0.1", port=0, cert=None, key=None)
    await process.start()
    try:
        base = f"http://127.0.0.1:{process.bound_port}"
        async with aiohttp.ClientSession() as client:
            body = review_body(pod_json("p", fraction="0.5"))
            async with client.post(f"{base}/validate", data=body) as reply:
                assert reply.status == 200
            await asyncio.sleep(0.6)  # reviews done are reported to the controller every 0.25 s
            async with client.get(f"{base}/metrics") as scrape:
                assert scrape.status == 200
                return await scrape.text()
    finally:
        await process.stop()


def _series(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


async def test_a_standby_exports_its_own_requests_but_not_the_cluster_state() -> None:
    """Issue #46: every replica exported the view, so sum(gpushare_pending_pods) read 2 for
    one pending pod. A standby now exports what it did itself (webhook reviews) and its
    build, and none of the cluster's state."""
    standby = _replica()
    got = _series(await _review_and_scrape(standby))
    assert not CLUSTER_STATE & got.keys(), CLUSTER_STATE & got.keys()
    reviews = got["gpushare_webhook_requests_total"]
    assert [dict(labels)["webhook"] for labels in reviews] == ["validate"]
    assert sum(reviews.values()) == 1.0
    ((labels, value),) = got["gpushare_build_info"].items()
    assert value == 1.0
    assert dict(labels)["component"] == "controller"
    assert dict(labels)["version"] == gpushare.__version__
    assert "python_version" in dict(labels)


async def test_summed_over_a_leader_and_a_standby_one_pending_pod_reads_one() -> None:
    leader, standby = _replica(), _replica()
    leader.leading = True
    scraped = [_series(await _review_and_scrape(ctx)) for ctx in (leader, standby)]
    # (Families with nothing to count, such as quarantined objects, have no samples.)
    assert {
        "gpushare_controller_nodes",
        "gpushare_controller_gpus",
        "gpushare_controller_pods",
        "gpushare_controller_view_synced",
        "gpushare_pending_pods",
    } <= scraped[0].keys()
    pending = [s.get("gpushare_pending_pods", {}) for s in scraped]
    assert sum(v for series in pending for v in series.values()) == 1.0
    assert pending[0] == {(("namespace", "team-a"),): 1.0}
    assert scraped[0]["gpushare_controller_nodes"] == {(): 1.0}
    # Requests and build_info come from both.
    for series in scraped:
        assert sum(series["gpushare_webhook_requests_total"].values()) == 1.0
        assert len(series["gpushare_build_info"]) == 1
    # Leadership changes hands: the new leader exports the state from its next scrape.
    standby.leading = True
    assert "gpushare_pending_pods" in _series(await _review_and_scrape(standby))


async def test_a_standby_exports_no_dra_totals() -> None:
    allocator, kube, _devices = setup(node_slice("n1", 2))
    kube.create(share_claim("c1", percent="30"))
    allocator.pod_event(gated_pod("p1", claim="c1"))
    assert await place(allocator) == 1
    ctx = ControllerContext(
        settings=Settings(), view=allocator.view, metrics=Metrics(allocator.view), kube=None
    )
    ctx.metrics.watch_claims(allocator)
    dra = (
        "gpushare_controller_dra_gpus",
        "gpushare_controller_dra_claims",
        "gpushare_controller_dra_allocated_percent",
        "gpushare_dra_claims_placed_total",
        "gpushare_dra_claims_left_to_scheduler_total",
    )
    assert all(samples(ctx.metrics.registry, name) == {} for name in dra)
    ctx.leading = True
    assert samples(ctx.metrics.registry, "gpushare_controller_dra_gpus") == {(): 2.0}
    assert samples(ctx.metrics.registry, "gpushare_dra_claims_placed_total") == {(): 1.0}
