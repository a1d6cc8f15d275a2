"""DRA-mode pods as the operator sees them on GPUs: where their claims put them, in a
GpuShare's ``status.placements`` and in latency protection (docs/dra.md, "GpuShares and
profiles"). The claims come through the same ledger the controller's claim watch feeds."""

import asyncio
from typing import Any

from gpushare.api.dra import ANN_DRA_GPU
from gpushare.api.names import CLASS_BATCH, CLASS_LATENCY
from gpushare.api.profile import GpuProfile
from gpushare.cluster.operator.guard import LatencyGuard
from gpushare.cluster.operator.profiling import placement_entries
from gpushare.cluster.operator.protection import ProtectionPolicy
from gpushare.cluster.operator.settings import OperatorConfig
from gpushare.cluster.state.view import ClusterView
from gpushare.kube.operator import EvictionOutcome
from tests.unit.cluster.dra.helpers import GIB, allocated_claim, ledger, mps_config, node_slice
from tests.unit.cluster.dra.test_devices import reserved
from tests.unit.cluster.operator.test_operator_profiling import dra_pod

GPU0 = "n1-GPU-0"


def claim(pod: str, *, percent: str, cls: str = CLASS_BATCH, made: str) -> Any:
    """The allocated claim of ``pod`` on GPU 0 of node n1, reserved for it."""
    body = reserved(
        allocated_claim(
            f"{pod}-gpu",
            namespace="ml",
            consumed={"gpuPercent": percent},
            config=mps_config(**{"class": cls}),
        ),
        pod,
    )
    body["metadata"]["creationTimestamp"] = made
    return body


def dra_view() -> ClusterView:
    """GPU 0 of node n1: a latency pod of GpuShare "train" (kept by the view) beside two batch
    pods no share governs (known from their claims only)."""
    devices = ledger(
        node_slice("n1", gpus=2),
        claims=[
            claim("infer", percent="30", cls=CLASS_LATENCY, made="2026-11-24T10:00:00Z"),
            claim("old", percent="20", made="2026-11-24T10:01:00Z"),
            claim("new", percent="20", made="2026-11-24T10:02:00Z"),
        ],
    )
    view = ClusterView()
    view.claim_holders = devices.holders
    view.upsert_share(
        {"metadata": {"name": "train", "namespace": "ml"}, "spec": {"fraction": "0.3"}}
    )
    view.upsert_pod(dra_pod("infer", node="n1", phase="Running", **{ANN_DRA_GPU: GPU0}))
    view.mark_synced()
    return view


def test_a_governed_dra_pod_is_listed_in_status_placements_at_its_claims_cap() -> None:
    view = dra_view()
    share = view.share("ml/train")
    assert share is not None
    [entry] = placement_entries(view.governed_pods(share))
    assert (entry.pod, entry.node, entry.gpu_uuid) == ("infer", "n1", GPU0)
    # A latency claim runs uncapped; 30 % of the 80 GiB GPU in proportion.
    assert (entry.thread_percent, entry.memory_limit_bytes) == (100, 24 * GIB)


def test_dra_pods_are_tenants_of_their_claims_gpu_whether_a_share_governs_them_or_not() -> None:
    view = dra_view()
    tenants = view.tenants_by_gpu()
    assert list(tenants) == [("n1", GPU0)]
    by_name = {p.name: p for p in tenants[("n1", GPU0)]}
    assert sorted(by_name) == ["infer", "new", "old"]
    assert by_name["infer"].gpu_class == CLASS_LATENCY
    assert by_name["infer"].annotations.get(ANN_DRA_GPU) == GPU0  # the view's facts of it
    assert {by_name[n].gpu_class for n in ("old", "new")} == {CLASS_BATCH}
    assert by_name["new"].placement is not None
    assert by_name["new"].placement.thread_percent == 50  # batch beside latency


def test_a_claim_still_naming_a_deleted_pod_never_stands_for_its_namesake() -> None:
    view = dra_view()
    recreated = dra_pod("infer", node="n1", phase="Running")
    recreated["metadata"]["uid"] = "uid-infer-2"
    view.upsert_pod(recreated)
    names = [p.name for p in view.tenants_by_gpu()[("n1", GPU0)]]
    assert sorted(names) == ["new", "old"]


class Profiler:
    def __init__(self, tensor: float) -> None:
        self.tensor = tensor
        self.read: list[tuple[str, str]] = []

    async def fetch(
        self, *, node: str, node_ip: str | None, gpu_uuid: str, window_s: int
    ) -> GpuProfile:
        self.read.append((node, gpu_uuid))
        return GpuProfile.from_json(
            {
                "gpu_uuid": gpu_uuid,
                "gpu_model": "NVIDIA H100 80GB HBM3",
                "simulated": True,
                "window_seconds": window_s,
                "sampled_seconds": window_s,
                "samples": 5,
                "tensor": self.tensor,
            }
        )


class Kube:
    def __init__(self) -> None:
        self.evicted: list[tuple[str, str, str | None]] = []
        self.events: list[tuple[str, str]] = []

    async def evict(self, *, namespace: str, name: str, uid: str | None = None) -> Any:
        self.evicted.append((namespace, name, uid))
        return EvictionOutcome.EVICTED

    async def post_event(
        self, *, about: Any, reason: str, message: str, warning: bool = False
    ) -> None:
        self.events.append((about.name, reason))

    async def get_share(self, *, namespace: str, name: str) -> Any:
        return None


def guard(view: ClusterView, kube: Kube, profiler: Profiler, **config: Any) -> LatencyGuard:
    settings = OperatorConfig(
        protection_policy=ProtectionPolicy(saturation_threshold=0.8, bad_readings=2), **config
    )
    return LatencyGuard(config=settings, kube=kube, view=view, profiler=profiler)  # type: ignore[arg-type]


def test_a_saturated_gpu_of_a_dra_latency_pod_evicts_the_newest_batch_claim_holder() -> None:
    view, kube, profiler = dra_view(), Kube(), Profiler(tensor=0.95)
    protect = guard(view, kube, profiler)

    async def two_ticks() -> None:
        assert await protect.tick() == []  # one bad reading: not yet
        [record] = await protect.tick()
        assert record.victim == "ml/new" and record.protected == ("ml/infer",)

    asyncio.run(two_ticks())
    assert profiler.read == [("n1", GPU0)] * 2
    # Evicted by name and UID: a pod made again under that name would be left alone.
    assert kube.evicted == [("ml", "new", "uid-new")]
    assert ("new", "EvictedForLatency") in kube.events
    assert ("infer", "NeighbourEvicted") in kube.events


def test_protection_scoped_to_namespaces_leaves_dra_pods_outside_them_alone() -> None:
    view, kube, profiler = dra_view(), Kube(), Profiler(tensor=0.95)
    protect = guard(view, kube, profiler, watch_namespaces=("other",))

    async def ticks() -> None:
        for _ in range(3):
            assert await protect.tick() == []

    asyncio.run(ticks())
    assert profiler.read == [] and kube.evicted == []


def test_without_a_claim_watch_the_view_reads_annotated_pods_only() -> None:
    view = dra_view()
    view.claim_holders = None
    assert view.tenants_by_gpu() == {}
    share = view.share("ml/train")
    assert share is not None
    pods = view.governed_pods(share)
    assert [p.name for p in pods] == ["infer"] and pods[0].placement is None
    assert pods[0].profiled_gpu == GPU0
