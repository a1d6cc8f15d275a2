"""assign_thread_percent: cautiously aggressive MPS thread caps."""

from hypothesis import given
from hypothesis import strategies as st

from gpushare.packing.model import Demand, GpuState, PipeProfile, Tenant
from gpushare.packing.threads import assign_thread_percent, over_latency_cap

H100 = GpuState("g0", 80 << 30, model="H100")


LATENCY = Tenant("ns/infer", 25, 1 << 30, gpu_class="latency")


def with_latency() -> GpuState:
    return GpuState("g1", 80 << 30, model="H100", tenants=[LATENCY])


def test_batch_pod_alone_or_beside_batch_neighbours_is_not_throttled() -> None:
    # An H100 run had ResNet-50, asking 60%, alone on the GPU at 60% threads: the cap written
    # at bind is fixed for the process's life, so the default limit is the whole GPU.
    small = PipeProfile(fp32=0.015, tensor=0.05, sm_occupancy=0.12, sm_utilization=0.38)
    assert assign_thread_percent(Demand(percent=60, profile=small), H100) == 100
    assert assign_thread_percent(Demand(percent=15), H100) == 100
    busy = GpuState("g2", 80 << 30, tenants=[Tenant("ns/a", 40, 1 << 30)])
    assert assign_thread_percent(Demand(percent=15), busy) == 100


def test_an_explicit_limit_is_the_cap_and_never_below_the_request() -> None:
    assert assign_thread_percent(Demand(percent=25, limit_percent=40), H100) == 40
    assert assign_thread_percent(Demand(percent=25, limit_percent=25), H100) == 25
    assert assign_thread_percent(Demand(percent=30, limit_percent=10), H100) == 30


def test_batch_pod_placed_beside_a_latency_pod_leaves_it_half_the_gpu() -> None:
    gpu = with_latency()
    assert assign_thread_percent(Demand(percent=15), gpu) == 50
    assert assign_thread_percent(Demand(percent=15, limit_percent=30), gpu) == 30
    # Its request is guaranteed even when that is more than half.
    assert assign_thread_percent(Demand(percent=70), gpu) == 70


def test_latency_pod_and_whole_gpus_are_never_capped() -> None:
    tiny = PipeProfile(sm_occupancy=0.01)
    latency = Demand(percent=25, gpu_class="latency", profile=tiny)
    assert assign_thread_percent(latency, H100) == 100
    assert assign_thread_percent(Demand(percent=25, gpu_class="latency"), with_latency()) == 100
    assert assign_thread_percent(Demand(percent=100, gpus=2), with_latency()) == 100


@given(
    percent=st.integers(min_value=1, max_value=100),
    limit=st.one_of(st.none(), st.integers(min_value=1, max_value=100)),
    latency=st.booleans(),
)
def test_batch_cap_lies_between_the_request_and_the_limit(
    percent: int, limit: int | None, latency: bool
) -> None:
    gpu = with_latency() if latency else H100
    threads = assign_thread_percent(Demand(percent=percent, limit_percent=limit), gpu)
    assert percent <= threads <= max(percent, 100 if limit is None else limit)
    if latency:
        assert threads <= max(percent, 50)


def test_a_tenant_that_started_before_a_latency_pod_is_over_the_cap_it_would_get_now() -> None:
    # The cap a batch pod gets beside a latency pod: its request or half the GPU, the larger.
    assert over_latency_cap(Tenant("ns/a", 30, 1 << 30, thread_percent=100))
    assert over_latency_cap(Tenant("ns/a", 60, 1 << 30, thread_percent=75))
    assert not over_latency_cap(Tenant("ns/a", 30, 1 << 30, thread_percent=50))
    assert not over_latency_cap(Tenant("ns/a", 60, 1 << 30, thread_percent=60))
    # A latency pod and a pod holding the whole GPU keep every thread.
    assert not over_latency_cap(LATENCY)
    assert not over_latency_cap(Tenant("ns/w", 100, 1 << 30, thread_percent=100))
