"""The profiler endpoint the operator reads job profiles from."""

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from gpushare.api.errors import InvalidInputError
from gpushare.node.exporter import SamplerSettings, build_exporter, pipe_profile_from_json
from gpushare.node.exporter.profiler import Profiler
from gpushare.node.exporter.server import serve
from gpushare.node.gpu.simulated import SimulatedBackend
from gpushare.packing.model import PipeProfile


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def rig() -> tuple[SimulatedBackend, Profiler, Clock]:
    backend = SimulatedBackend("1xH100-80GB,1xA100-80GB", node_name="n")
    exporter = build_exporter(
        backend=backend,
        node_name="n",
        placements=list,
        settings=SamplerSettings(interval_s=1.0, history_s=120.0),
    )
    clock = Clock()
    exporter.sampler._clock = clock
    return backend, exporter.profiler, clock


def run(backend: SimulatedBackend, profiler: Profiler, clock: Clock, seconds: int) -> None:
    for _ in range(seconds):
        clock.now += 1.0
        profiler.sampler.sample_once()


def test_window_averages_only_the_recent_load(
    rig: tuple[SimulatedBackend, Profiler, Clock],
) -> None:
    backend, profiler, clock = rig
    gpu = backend.inventory()[0]
    profiler.sampler.sample_once()
    backend.set_load(gpu.uuid, pipes={"fp32": 0.8}, sm_occupancy=0.6, memory_used_bytes=2**30)
    run(backend, profiler, clock, 10)
    backend.set_load(
        gpu.uuid,
        pipes={"tensor": 0.9, "tensor_hmma": 0.9},
        sm_occupancy=0.4,
        memory_used_bytes=3 * 2**30,
    )
    run(backend, profiler, clock, 10)

    recent = profiler.profile(gpu=gpu.uuid, window_s=10)
    assert recent.fp32 == pytest.approx(0.0)
    assert recent.tensor == pytest.approx(0.9)
    assert recent.sm_occupancy == pytest.approx(0.4)
    assert recent.memory_used_bytes == pytest.approx(3 * 2**30)
    assert recent.sampled_seconds == pytest.approx(10)

    both = profiler.profile(gpu="0", window_s=20)
    assert both.fp32 == pytest.approx(0.4)
    assert both.tensor == pytest.approx(0.45)
    assert both.gpu_model == gpu.model
    assert both.simulated is True
    assert both.unavailable == ()


def test_profile_answer_becomes_the_policys_pipe_profile(
    rig: tuple[SimulatedBackend, Profiler, Clock],
) -> None:
    backend, profiler, clock = rig
    gpu = backend.inventory()[0]
    backend.set_load(
        gpu.uuid, pipes={"fp64": 0.3, "tensor": 0.5}, sm_occupancy=0.2, memory_used_bytes=0
    )
    run(backend, profiler, clock, 5)
    status, body = profiler.handle_query({"gpu": gpu.uuid, "window": "5"})
    assert status == 200
    profile = pipe_profile_from_json(json.loads(json.dumps(body)))
    assert profile == PipeProfile(
        fp16=0.0,
        fp32=0.0,
        fp64=0.3,
        tensor=0.5,
        sm_occupancy=0.2,
        dram_bandwidth=pytest.approx(0.25),
        gpu_model=gpu.model,
        # The simulated backend's SM utilization: 1.2 x the busiest pipe; NVML's: 1.5 x.
        sm_utilization=pytest.approx(0.6),
        utilization=pytest.approx(0.75),
    )


def test_gpu_without_gpm_cannot_give_a_profile(
    rig: tuple[SimulatedBackend, Profiler, Clock],
) -> None:
    backend, profiler, clock = rig
    run(backend, profiler, clock, 3)
    status, body = profiler.handle_query({"gpu": "1"})
    assert status == 200
    assert body["fp32"] is None
    assert "fp32" in body["unavailable"]
    assert body["utilization"] is not None
    with pytest.raises(InvalidInputError, match=r"profile\.fp16.*Hopper"):
        pipe_profile_from_json(body)


@pytest.mark.parametrize(
    ("query", "status", "field"),
    [
        ({}, 400, "gpu"),
        ({"gpu": ""}, 400, "gpu"),
        ({"gpu": "0", "window": "abc"}, 400, "window"),
        ({"gpu": "0", "window": "0"}, 400, "window"),
        ({"gpu": "0", "window": "-5"}, 400, "window"),
        ({"gpu": "0", "window": "nan"}, 400, "window"),
        ({"gpu": "0", "window": "121"}, 400, "window"),
        ({"gpu": "0", "windw": "30"}, 400, "windw"),
        ({"gpu": "GPU-nope"}, 404, "gpu"),
    ],
)
def test_bad_query_is_refused_naming_the_parameter(
    rig: tuple[SimulatedBackend, Profiler, Clock], query: dict[str, str], status: int, field: str
) -> None:
    backend, profiler, clock = rig
    run(backend, profiler, clock, 2)
    got, body = profiler.handle_query(query)
    assert (got, body["field"]) == (status, field)
    assert body["fix"]


def test_no_reading_yet_asks_to_retry(rig: tuple[SimulatedBackend, Profiler, Clock]) -> None:
    _backend, profiler, _ = rig
    profiler.sampler.sample_once()
    profiler.sampler._clock.now += 100  # type: ignore[attr-defined]
    status, body = profiler.handle_query({"gpu": "0", "window": "10"})
    assert status == 503
    assert "retry" in body["fix"]


@pytest.fixture
def served() -> Iterator[tuple[str, str]]:
    backend = SimulatedBackend("1xH200", node_name="n")
    exporter = build_exporter(
        backend=backend,
        node_name="n",
        placements=list,
        settings=SamplerSettings(interval_s=0.1),
    )
    exporter.sampler.sample_once()
    registry = CollectorRegistry()
    registry.register(exporter.collector)
    server = serve(registry=registry, profiler=exporter.profiler, host="127.0.0.1")
    try:
        yield f"http://127.0.0.1:{server.port}", backend.inventory()[0].uuid
    finally:
        server.stop()


def test_http_profile_and_metrics_on_one_server(served: tuple[str, str]) -> None:
    base, uuid = served
    with urllib.request.urlopen(f"{base}/profile?gpu={uuid}&window=5") as resp:
        assert resp.headers["Content-Type"] == "application/json"
        body = json.load(resp)
    assert body["gpu_uuid"] == uuid
    assert body["samples"] == 1
    with urllib.request.urlopen(f"{base}/metrics") as resp:
        assert b"gpushare_gpu_pipe_utilization_ratio{" in resp.read()


def test_http_bad_parameter_is_a_400_naming_it(served: tuple[str, str]) -> None:
    base, _ = served
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{base}/profile?gpu=0&gpu=1")
    assert err.value.code == 400
    assert json.load(err.value)["field"] == "gpu"
