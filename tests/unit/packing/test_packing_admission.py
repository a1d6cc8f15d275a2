"""Interference admission through the Placer: the GPUs a pod is kept off, and why."""

from gpushare.packing.admission import DEFAULT_BOUNDS, Admission
from gpushare.packing.interference import load_default
from gpushare.packing.model import Demand, GpuState, NodeState, PipeProfile, Tenant
from gpushare.packing.placer import Placer
from gpushare.packing.policy import Policy

# Solo H200 GPM profiles as the GPU benchmark measured them (see test_packing_interference).
FP32_GEMM = PipeProfile(fp32=0.77, sm_occupancy=0.95, dram_bandwidth=0.25)
INFERENCE = PipeProfile(tensor=0.15, fp32=0.05, sm_occupancy=0.3, dram_bandwidth=0.15)
LIGHT = PipeProfile(fp32=0.05, sm_occupancy=0.08, dram_bandwidth=0.03)
GIB = 1 << 30


def node(*gpus: GpuState) -> NodeState:
    return NodeState("n1", list(gpus))


def gpu(uuid: str, *tenants: Tenant) -> GpuState:
    return GpuState(uuid, 80 * GIB, model="H100", tenants=list(tenants))


def trainer(key: str = "ns/train") -> Tenant:
    return Tenant(key, 60, 40 * GIB, profile=FP32_GEMM, thread_percent=100)


LATENCY = Demand(percent=30, gpu_class="latency", profile=INFERENCE)


def test_a_latency_pod_goes_to_the_gpu_where_its_neighbour_is_light() -> None:
    # binpack alone would take the fuller GPU (the trainer's, 60 % used); admission keeps the
    # latency pod off it because the trainer would slow it past 1.15x.
    n = node(gpu("heavy", trainer()), gpu("light", Tenant("ns/etl", 30, 20 * GIB, profile=LIGHT)))
    plain = Placer(Policy.BINPACK)
    assignment = plain.choose_gpus(n, LATENCY)
    assert assignment is not None and assignment.gpu_uuids == ("heavy",)
    admitting = Placer(Policy.BINPACK, admission=Admission())
    assignment = admitting.choose_gpus(n, LATENCY)
    assert assignment is not None and assignment.gpu_uuids == ("light",)
    assert admitting.refusal(n, LATENCY) is None


def test_a_node_whose_only_room_is_beside_a_heavy_neighbour_is_refused_with_the_reason() -> None:
    n = node(gpu("heavy", trainer()))
    for policy in Policy:
        placer = Placer(policy, admission=Admission())
        assert placer.choose_gpus(n, LATENCY) is None
        assert placer.node_cost(n, LATENCY) is None
        reason = placer.refusal(n, LATENCY)
        assert reason is not None and "GPU heavy" in reason and "1.15x bound" in reason
    # Without admission the same node takes it (what `--no-interference-admission` gives).
    assert Placer(Policy.GPUSHARE).choose_gpus(n, LATENCY) is not None


def test_pods_nobody_profiled_are_placed_by_fit_alone() -> None:
    # Nothing measured on the GPU or for the pod: no prediction to refuse on (openb's pods).
    n = node(gpu("g0", Tenant("ns/a", 60, 40 * GIB, thread_percent=100)))
    demand = Demand(percent=30, gpu_class="latency")
    placer = Placer(Policy.GPUSHARE, admission=Admission())
    assert placer.choose_gpus(n, demand) is not None
    assert placer.refusal(n, demand) is None


def test_an_unprofiled_newcomer_is_assumed_heavy_beside_a_profiled_latency_pod() -> None:
    web = Tenant("ns/web", 40, 30 * GIB, gpu_class="latency", profile=INFERENCE, thread_percent=100)
    n = node(gpu("g0", web))
    placer = Placer(Policy.GPUSHARE, admission=Admission())
    assert placer.choose_gpus(n, Demand(percent=60)) is None
    reason = placer.refusal(n, Demand(percent=60))
    assert reason is not None and "ns/web" in reason


def test_whole_gpus_and_empty_gpus_are_always_admitted() -> None:
    placer = Placer(Policy.GPUSHARE, admission=Admission())
    assert placer.choose_gpus(node(gpu("g0")), LATENCY) is not None
    whole = Demand(percent=100, gpus=2, profile=FP32_GEMM)
    assert placer.choose_gpus(node(gpu("g0"), gpu("g1")), whole) is not None


def test_an_unprofiled_batch_pod_may_join_profiled_batch_pods() -> None:
    # Nothing is known of the newcomer and nobody there is latency-class: counted heavy it would
    # be refused beside nearly everyone, so admission stays out (fit and fragmentation decide).
    n = node(gpu("g0", trainer()))
    placer = Placer(Policy.GPUSHARE, admission=Admission())
    assert placer.choose_gpus(n, Demand(percent=30)) is not None
    assert placer.refusal(n, Demand(percent=30)) is None
    # A latency newcomer without a profile is still kept from the measured heavy job.
    assert placer.choose_gpus(n, Demand(percent=30, gpu_class="latency")) is None


def test_two_saturating_batch_pods_are_judged_by_the_work_they_do_together() -> None:
    """Two FP64 GEMMs at 45 % each, uncapped: the model's terms alone predict each 2.37x
    slower, past the batch bound, but together they keep the GPU busy (measured on an H200:
    2.0x each, one job's work); the pack's prediction, held to one job's work, admits the
    second at 2.00x."""
    gemm = PipeProfile(tensor=0.97, sm_occupancy=0.12, dram_bandwidth=0.12, sm_utilization=0.98)
    first = Tenant("ns/gemm-a", 45, 20 * GIB, profile=gemm, thread_percent=100)
    second = Demand(percent=45, memory_bytes=20 * GIB, profile=gemm)
    terms_alone = load_default().predict(gemm, 100, [(gemm, 100)])
    assert terms_alone > DEFAULT_BOUNDS["batch"]
    placer = Placer(Policy.GPUSHARE, admission=Admission())
    assert placer.refusal(node(gpu("g0", first)), second) is None
