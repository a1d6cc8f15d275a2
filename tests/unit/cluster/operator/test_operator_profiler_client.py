"""The operator's profiler client against the node agent's real /profile endpoint (simulated
GPUs, so no GPU is needed), and its refusal of answers it cannot trust."""

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from gpushare.cluster.operator.profiler_client import ProfilerClient
from gpushare.cluster.operator.readings import (
    ProfilerError,
    agent_url,
    parse_reading,
)
from gpushare.cluster.operator.reconcile import utcnow
from gpushare.node.exporter import SamplerSettings, build_exporter
from gpushare.node.exporter.server import serve
from gpushare.node.gpu.simulated import SimulatedBackend


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def agent() -> Iterator[tuple[SimulatedBackend, str]]:
    backend = SimulatedBackend("1xH200", node_name="n1")
    exporter = build_exporter(
        backend=backend,
        node_name="n1",
        placements=list,
        settings=SamplerSettings(interval_s=1.0, history_s=300.0),
    )
    clock = Clock()
    exporter.sampler._clock = clock
    uuid = backend.inventory()[0].uuid
    exporter.sampler.sample_once()
    backend.set_load(
        uuid,
        pipes={"tensor": 0.78, "tensor_hmma": 0.78, "fp32": 0.05},
        sm_occupancy=0.55,
        memory_used_bytes=20 * 2**30,
    )
    for _ in range(30):
        clock.now += 1.0
        exporter.sampler.sample_once()
    server = serve(registry=CollectorRegistry(), profiler=exporter.profiler, host="127.0.0.1")
    try:
        yield backend, f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


async def test_profile_of_a_running_job_comes_back_as_a_share_profile(
    agent: tuple[SimulatedBackend, str],
) -> None:
    backend, url = agent
    client = ProfilerClient(url_template=url, timeout_s=5)
    try:
        reading = await client.fetch(
            node="n1", node_ip=None, gpu_uuid=backend.inventory()[0].uuid, window_s=20
        )
    finally:
        await client.close()
    profile = reading.stored(now=utcnow())
    assert profile.tensor == pytest.approx(0.78)
    assert profile.fp32 == pytest.approx(0.05)
    assert profile.fp64 == pytest.approx(0.0)
    assert profile.sm_occupancy == pytest.approx(0.55)
    assert profile.peak_memory_bytes == 20 * 2**30
    assert profile.gpu_model == "NVIDIA H200"
    assert profile.simulated is True
    assert profile.sampled_seconds == pytest.approx(20)


async def test_unknown_gpu_is_an_error_naming_the_agent_and_the_gpu(
    agent: tuple[SimulatedBackend, str],
) -> None:
    _, url = agent
    client = ProfilerClient(url_template=url, timeout_s=5)
    try:
        with pytest.raises(ProfilerError) as err:
            await client.fetch(node="n1", node_ip=None, gpu_uuid="GPU-nope", window_s=10)
    finally:
        await client.close()
    assert "404" in str(err.value) and "GPU-nope" in str(err.value)


async def test_unreachable_agent_is_a_profiler_error() -> None:
    client = ProfilerClient(url_template="http://127.0.0.1:9/", timeout_s=1)
    try:
        with pytest.raises(ProfilerError):
            await client.fetch(node="n1", node_ip=None, gpu_uuid="GPU-x", window_s=1)
    finally:
        await client.close()


def test_agent_url_template_uses_the_node_address() -> None:
    assert (
        agent_url("http://{node_ip}:9400/", node="n1", node_ip="10.0.0.5") == "http://10.0.0.5:9400"
    )
    assert (
        agent_url("http://{node}.agents:9400", node="n1", node_ip=None) == "http://n1.agents:9400"
    )
    with pytest.raises(ProfilerError, match="no address"):
        agent_url("http://{node_ip}:9400", node="n1", node_ip=None)


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ([], "not a JSON object"),
        ({"gpu_model": "H200", "sampled_seconds": 5, "tensor": "high"}, "profile.tensor"),
        ({"gpu_model": "H200", "sampled_seconds": 5, "fp32": 3.0}, "outside 0..1"),
        ({"sampled_seconds": 5}, "gpu_model"),
        ({"gpu_model": "H200"}, "sampled_seconds"),
    ],
)
def test_untrustworthy_answers_are_refused(payload: object, words: str) -> None:
    with pytest.raises(ProfilerError, match=words):
        parse_reading(payload)


def test_unmeasured_counters_stay_unknown_not_zero() -> None:
    reading = parse_reading(
        {"gpu_model": "Tesla T4", "sampled_seconds": 10, "fp16": None, "memory_used_bytes": 1.5e9}
    )
    assert reading.fp16 is None and reading.tensor is None
    assert reading.peak_memory_bytes == 1_500_000_000  # no peak sent: the average
