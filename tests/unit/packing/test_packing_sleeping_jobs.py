"""Jobs that sleep between bursts (notebooks): slowed by their neighbours only while their
kernels run, so they neither look harmed past their bound nor hold batch jobs back
(docs/packing.md, "Jobs that sleep")."""

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from gpushare.api.names import CLASS_LATENCY
from gpushare.api.profile import GpuProfile
from gpushare.packing.admission import Admission
from gpushare.packing.interference import KERNEL_TIME_FIT, load_default, while_running
from gpushare.packing.model import Demand, GpuState, PipeProfile, Tenant
from gpushare.packing.opportunistic import Member, Opportunism, rates
from gpushare.packing.stored_profile import pipe_profile
from tests.unit.packing.h200_profiles import (
    GPT2,
    NOTEBOOK,
    NOTEBOOK_COUNTERS,
    RESNET18,
    RESNET50,
)

GIB = 2**30
UNMEASURED = replace(NOTEBOOK, utilization=None)


def gpu(*tenants: Tenant) -> GpuState:
    return GpuState(uuid="GPU-0", memory_bytes=141 * GIB, model="H200", tenants=list(tenants))


def notebooks(profile: PipeProfile) -> list[Tenant]:
    """The notebooks trace's three notebooks (5%, 50% and 5% guaranteed) and a ResNet-18."""
    return [
        Tenant("ns/nb0", 5, 2 * GIB, profile=profile, thread_percent=100, workload="nb"),
        Tenant("ns/nb1", 50, 2 * GIB, profile=profile, thread_percent=100, workload="nb"),
        Tenant("ns/nb2", 5, 2 * GIB, profile=profile, thread_percent=100, workload="nb"),
        Tenant("ns/r18", 15, 4 * GIB, profile=RESNET18, thread_percent=100, workload="r18"),
    ]


def test_a_notebook_is_predicted_slowed_only_while_its_kernels_run() -> None:
    model = load_default()
    beside = [Member(RESNET50, 100), Member(GPT2, 100)]
    raw = 1.0 / rates([Member(UNMEASURED, 100), *beside], model)[0]
    sleeping = 1.0 / rates([Member(NOTEBOOK, 100), *beside], model)[0]
    assert raw > 1.9  # read as a job of tiny kernels behind large ones: at the batch bound
    assert sleeping == pytest.approx(1.0 + (raw - 1.0) * NOTEBOOK.utilization / KERNEL_TIME_FIT)
    assert sleeping < 1.5
    # A job that keeps a kernel running as much as the jobs the model is fit on is unchanged.
    assert while_running(2.4, RESNET18) == 2.4 and while_running(2.4, UNMEASURED) == 2.4


def test_a_latency_pod_is_held_to_its_bound_whole_however_little_it_runs() -> None:
    # Each request of a service is slowed whole; its idle time between requests is no excuse.
    model = load_default()
    service = replace(NOTEBOOK, utilization=0.05)
    beside = [Member(RESNET50, 100)]
    with_time = rates([Member(service, 100, gpu_class=CLASS_LATENCY, percent=25), *beside], model)
    without = rates([Member(UNMEASURED, 100, gpu_class=CLASS_LATENCY, percent=25), *beside], model)
    assert with_time[0] == pytest.approx(without[0]) and with_time[0] < 1.0


def test_an_opted_in_job_may_join_sleeping_notebooks() -> None:
    # The notebooks trace on an H200 (run 32): GPT-2, opted in, was held back beside three
    # sleeping notebooks and a ResNet-18 while the notebooks were predicted 2.1-2.8x slower.
    demand = Demand(
        percent=60, profile=GPT2, opportunistic=True, workload="gpt2",
        peak_memory_bytes=10 * GIB,
    )  # fmt: skip
    refused = Opportunism().gpu_option(gpu(*notebooks(UNMEASURED)), demand)
    assert isinstance(refused, str) and "below" in refused
    option = Opportunism().gpu_option(gpu(*notebooks(NOTEBOOK)), demand)
    assert not isinstance(option, str) and option.gain > 0.3


def test_the_stored_profile_keeps_the_kernel_time_and_an_older_one_has_none() -> None:
    measured = GpuProfile.from_counters(NOTEBOOK_COUNTERS, gpu_model="NVIDIA H200")
    status = measured.stored(now=datetime(2026, 11, 28, tzinfo=UTC)).to_status()
    assert status["utilization"] == 0.071
    assert pipe_profile(GpuProfile.from_status(status)).utilization == 0.071
    older = {k: v for k, v in status.items() if k != "utilization"}
    assert pipe_profile(GpuProfile.from_status(older)).utilization is None


def test_guaranteed_admission_does_not_refuse_a_pod_for_a_sleeping_notebook() -> None:
    # Two ResNet-50s beside a notebook: read as a job of tiny kernels, the notebook would be
    # pushed past the batch bound and the second ResNet-50 refused; it is not, since the
    # notebook is slowed only while its kernels run.
    def with_notebook(profile: PipeProfile) -> GpuState:
        resnet = Tenant("ns/r50", 20, 10 * GIB, profile=RESNET50, thread_percent=100)
        return gpu(notebooks(profile)[0], resnet)

    demand = Demand(percent=20, profile=RESNET50)
    refusal = Admission().gpu_reason(with_notebook(UNMEASURED), demand)
    assert refusal is not None and "ns/nb0" in refusal and "2.00x bound" in refusal
    assert Admission().gpu_reason(with_notebook(NOTEBOOK), demand) is None
