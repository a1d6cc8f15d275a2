"""The GPU benchmark on a GPU whose profiler measures nothing (no NVML GPM: before Hopper): jobs
stay unprofiled, as gpushare's operator leaves them, instead of reading as idle."""

import time
from pathlib import Path
from typing import Any

import pytest

from bench.gpu import run, traces
from bench.gpu.catalog import KINDS
from bench.gpu.colocate import PackResult, Stage
from bench.gpu.gpm import PROFILE_KEYS
from bench.gpu.schemes import Launch


class NoGpmSampler:
    """What ``gpm.Sampler`` answers where GPM is unsupported: no profile for any window."""

    source = "gpushare.node.exporter.profiler (no GPM on this GPU)"

    def __init__(self, **_: Any) -> None:
        pass

    def profile_last(self, window_s: float) -> dict[str, float] | None:
        return None

    def close(self) -> None:
        pass


@pytest.fixture
def measured_stages(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Stands in for the workers: every job alone runs at 10 it/s; records the stages run."""
    names: list[str] = []

    def fake(*, pool: Any, stages: list[Stage], deadline: float, on_solo: Any) -> list[Any]:
        out = []
        for stage in stages:
            names.append(stage.name)
            for pack in stage.packs:
                if len(pack) == 1:
                    on_solo(pack[0], 0.0, 2.0, 10.0)
                out.append(PackResult(tuple(pack), tuple(10.0 for _ in pack)))
        return out

    monkeypatch.setattr(run, "measure_stages", fake)
    monkeypatch.setattr(run, "Sampler", NoGpmSampler)
    monkeypatch.setattr(run.Ctx, "daemon", lambda self: None)
    return names


def test_without_gpm_no_job_is_profiled_and_every_unsized_job_asks_for_the_whole_gpu(
    tmp_path: Path, measured_stages: list[str]
) -> None:
    ctx = run.Ctx(
        args=run.parse_args(["--out", str(tmp_path), "--budget-s", "120"]),
        t_start=time.time(),
        tmp=tmp_path,
        gpu_name="NVIDIA A100-SXM4-80GB",
    )
    st = run.State()
    run.phase_a(ctx, st)
    assert st.profiles == {} and st.raw_profiles == {}
    # Only the solo stage ran: packs without profiles could not teach or test the model.
    assert len(measured_stages) == 1
    assert any("no job could be profiled" in e and "GPM" in e for e in ctx.errors)
    assert st.fractions["resnet18"] == 1.0 and st.fractions["infer"] == 0.25
    assert set(st.solo) >= set(KINDS)

    # gpushare then places by requests alone: a row that sets a fraction still shares the GPU.
    decider = run.make_decider(ctx, st)
    assert decider.profiles == {}
    small = traces.TraceJob("a-resnet18", "resnet18", 0.0, 1.0, 0.3, fixed_request=True)
    launch = decider(small, [])
    assert isinstance(launch, Launch) and launch.mps and launch.thread_percent == 100


def test_a_profile_missing_any_counter_the_product_needs_is_not_kept() -> None:
    st = run.State()
    full = dict.fromkeys(PROFILE_KEYS, 0.3) | {"sm_utilization": 0.5}
    run.record_profile(st, "lstm", {k: v for k, v in full.items() if k != "tensor"})
    run.record_profile(st, "dgemm", None)
    assert st.profiles == {}
    run.record_profile(st, "resnet18", full)
    assert st.profiles["resnet18"]["tensor"] == 0.3
    assert st.raw_profiles["resnet18"]["sm_utilization"] == 0.5
