"""The background sampler: GPM's >= 100 ms gap, and scrapes that never wait for NVML."""

import itertools
import time

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.node.exporter import GpmSampler, SamplerSettings
from gpushare.node.gpu.simulated import SimulatedBackend


def test_interval_below_gpm_minimum_is_refused_with_the_fix() -> None:
    with pytest.raises(InvalidInputError) as err:
        SamplerSettings(interval_s=0.05)
    assert err.value.field == "sample_interval_s"
    assert "0.1" in err.value.fix


def test_history_shorter_than_one_interval_is_refused() -> None:
    with pytest.raises(InvalidInputError) as err:
        SamplerSettings(interval_s=2.0, history_s=1.0)
    assert err.value.field == "history_s"


def test_thread_reads_every_gpu_no_faster_than_the_interval() -> None:
    backend = SimulatedBackend("3xH100-80GB", node_name="n")
    sampler = GpmSampler(backend=backend, settings=SamplerSettings(interval_s=0.1))
    started = time.monotonic()
    sampler.start()
    try:
        deadline = started + 20
        while sampler.passes < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sampler.stop()
    elapsed = time.monotonic() - started
    for gpu in backend.inventory():
        samples = sampler.history(gpu.uuid, window_s=600)
        assert len(samples) >= 6
        gaps = [b.at - a.at for a, b in itertools.pairwise(samples)]
        assert min(gaps) >= 0.1 - 1e-6
    assert elapsed >= 0.5  # six passes cannot take less than five intervals
    assert all(r.latest is not None for r in sampler.readings())
    assert sampler.cpu_seconds > 0


def test_a_slow_pass_does_not_make_the_next_read_early() -> None:
    backend = SimulatedBackend("1xH100-80GB", node_name="n")
    now = [10.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    sampler = GpmSampler(
        backend=backend,
        settings=SamplerSettings(interval_s=0.1),
        clock=lambda: now[0],
        sleep=sleep,
    )
    sampler.sample_once()
    now[0] += 0.03  # the next pass comes only 30 ms later
    sampler.sample_once()
    samples = sampler.history(backend.inventory()[0].uuid, window_s=600)
    assert samples[1].at - samples[0].at == pytest.approx(0.1)
    assert slept == [pytest.approx(0.07)]


def test_history_is_bounded_by_the_configured_window() -> None:
    backend = SimulatedBackend("1xH100-80GB", node_name="n")
    now = [0.0]
    sampler = GpmSampler(
        backend=backend,
        settings=SamplerSettings(interval_s=1.0, history_s=10.0),
        clock=lambda: now[0],
    )
    for _ in range(100):
        now[0] += 1.0
        sampler.sample_once()
    assert len(sampler.history(backend.inventory()[0].uuid, window_s=1000)) <= 12
