"""bench.gpu.online_eval: the product's online corrections replayed over measured packs."""

import json
from pathlib import Path

from bench.gpu import online_eval
from bench.gpu.fitting import ColocationJob, ColocationRecord
from gpushare.packing.corrections import MIN_WINDOWS
from gpushare.packing.interference import load_default
from gpushare.packing.model import PipeProfile

GEMM = PipeProfile(fp32=0.8, sm_occupancy=0.9, dram_bandwidth=0.3, sm_utilization=0.95)
CONV = PipeProfile(fp16=0.3, tensor=0.4, sm_occupancy=0.7, dram_bandwidth=0.4, sm_utilization=0.8)


def _pack(power: float) -> ColocationRecord:
    """Two jobs measured exactly ``predicted ** power`` times slower (power < 1: the model is
    pessimistic about both)."""
    model = load_default()
    jobs = []
    for name, me, other in (("gemm", GEMM, CONV), ("conv", CONV, GEMM)):
        predicted = model.predict(me, 100, [(other, 100)])
        jobs.append(ColocationJob(name, me, 100, 10.0, 10.0 / predicted**power))
    return ColocationRecord("GPU", tuple(jobs))


def test_the_one_factor_that_explains_a_packs_work_is_found() -> None:
    base = [2.0, 3.0]
    work = sum(1.0 / b**0.7 for b in base)
    assert abs(online_eval.explaining_k(base, work) - 0.7) < 1e-3


def test_corrections_learned_over_enough_windows_bring_a_pessimistic_model_closer() -> None:
    packs = [_pack(0.7) for _ in range(MIN_WINDOWS + 4)]
    result = online_eval.replay(packs, unseen=("conv",))
    assert result["unseen_kinds_predictions"] == 2 * len(packs)
    assert result["unseen_kinds_mape_corrected"] < result["unseen_kinds_mape_shipped"]
    assert result["factors"]["gemm"] < 1.0


def test_the_command_writes_both_files_and_refuses_a_bad_file(tmp_path: Path) -> None:
    good = tmp_path / "run-colocations.json"
    records = [
        {
            "gpu": "GPU",
            "jobs": [
                {"name": j.name, "profile": vars(j.profile) | {}, "thread_percent": 100,
                 "solo_rate": j.solo_rate, "colocated_rate": j.colocated_rate}
                for j in _pack(0.8).jobs
            ],
        }
    ]  # fmt: skip
    good.write_text(json.dumps(records))
    assert online_eval.main([str(good), "--out", str(tmp_path / "out")]) == 0
    assert "run" in json.loads((tmp_path / "out.json").read_text())["runs"]
    assert "with corrections" in (tmp_path / "out.md").read_text()
    bad = tmp_path / "bad-colocations.json"
    bad.write_text('{"not": "a list"}')
    assert online_eval.main([str(bad)]) == 2
