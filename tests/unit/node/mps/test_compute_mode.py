"""Leaving MPS closed by default (issue 45; gpushare.node.mps.compute_mode): the agent sets
EXCLUSIVE_PROCESS on an idle GPU before its MPS daemon starts, never on a GPU a process
already uses, never on a simulated GPU, and only when told to. A stand-in nvidia-smi keeps
the mode in a file: no real GPU's mode is ever touched here."""

import stat
from pathlib import Path

from gpushare.node.mps.compute_mode import ComputeModeGate

UUID = "GPU-00000000-0000-0000-0000-000000000001"

FAKE_SMI = """#!/bin/sh
state="$(dirname "$0")"
echo "$*" >> "$state/calls"
case "$*" in
  *--query-gpu=compute_mode*) cat "$state/mode" ;;
  *--query-compute-apps=pid*) cat "$state/apps" ;;
  *"-c EXCLUSIVE_PROCESS"*) echo Exclusive_Process > "$state/mode"; echo "Compute mode set" ;;
  *) exit 9 ;;
esac
"""


def fake_smi(tmp_path: Path, *, mode: str = "Default", apps: str = "") -> Path:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "mode").write_text(mode + "\n")
    (tmp_path / "apps").write_text(apps)
    (tmp_path / "calls").write_text("")
    return smi


def gate(smi: Path, *, close: bool = True, simulated: bool = False) -> ComputeModeGate:
    return ComputeModeGate(
        required=False, simulated=simulated, timeout_s=5, close=close, smi=str(smi)
    )


def test_an_idle_gpu_is_set_to_exclusive_process_so_no_container_leaves_mps(
    tmp_path: Path,
) -> None:
    smi = fake_smi(tmp_path)
    done = gate(smi).close(UUID)
    assert done is not None and "EXCLUSIVE_PROCESS" in done and "was Default" in done
    assert (tmp_path / "mode").read_text().strip() == "Exclusive_Process"
    assert gate(smi).refusal(UUID) is None


def test_a_gpu_with_a_process_on_it_keeps_its_mode(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path, apps="4242\n")
    assert gate(smi).close(UUID) is None
    assert (tmp_path / "mode").read_text().strip() == "Default"
    assert "-c EXCLUSIVE_PROCESS" not in (tmp_path / "calls").read_text()


def test_turned_off_it_never_sets_a_mode(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path)
    assert gate(smi, close=False).close(UUID) is None
    assert (tmp_path / "calls").read_text() == ""


def test_a_simulated_gpu_never_reaches_nvidia_smi(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path)
    assert gate(smi, simulated=True).close(UUID) is None
    assert (tmp_path / "calls").read_text() == ""


def test_a_gpu_already_exclusive_is_left_alone(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path, mode="Exclusive_Process")
    assert gate(smi).close(UUID) is None
    assert "-c EXCLUSIVE_PROCESS" not in (tmp_path / "calls").read_text()


def test_a_required_mode_that_could_not_be_set_refuses_the_gpu_with_the_fix(
    tmp_path: Path,
) -> None:
    smi = fake_smi(tmp_path, apps="4242\n")
    required = ComputeModeGate(
        required=True, simulated=False, timeout_s=5, close=True, smi=str(smi)
    )
    assert required.close(UUID) is None
    why = required.refusal(UUID)
    assert why is not None and "fix: nvidia-smi -i" in why
