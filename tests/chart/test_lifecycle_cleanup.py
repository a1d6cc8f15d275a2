"""What the node agent's preStop clean-up removes on uninstall in DRA mode: the claims' CDI specs
the agent wrote (named as the agent names them) and the plugin's socket and checkpoint; another
vendor's specs in the same directory stay. And its wait, before a GPU Operator driver upgrade or
MIG change, for the agent's drain (issue #66)."""

import json
import time
from pathlib import Path
from types import ModuleType

import pytest

from gpushare.api.gpu_operator import (
    DEPLOY_LABELS,
    MIG_CONFIG_STATE,
    MIG_DRAIN_STATES,
    PAUSED_VALUES,
    UPGRADE_DRAIN_STATES,
    UPGRADE_STATE,
)
from gpushare.node.dra.cdi import CdiDir
from gpushare.node.gpu_operator import DRAIN_MARKER
from tests.fixtures.helm_chart import CHART
from tests.fixtures.scripts import load_script

UID = "0b6e1c5e-9b1f-4d6a-8f57-3a0d1f2c4b7e"


def _lifecycle() -> ModuleType:
    return load_script(CHART / "files" / "lifecycle.py", "lifecycle")


def test_uninstall_removes_the_agents_cdi_specs_and_plugin_files_only(tmp_path: Path) -> None:
    cdi = CdiDir(tmp_path / "cdi")
    ours = cdi.write(UID, {"env": ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25"]})
    half = ours.with_name(f".{ours.name}.tmp")  # a write the agent did not finish
    half.write_text("{")
    other = cdi.root / "nvidia.com-gpu.json"
    other.write_text(json.dumps({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu"}))
    plugin = tmp_path / "plugins" / "gpu.gpushare.io"
    plugin.mkdir(parents=True)
    (plugin / "checkpoint.json").write_text("{}")
    (plugin / "dra.sock").write_text("")

    _lifecycle().remove_dra_files(str(cdi.root), str(plugin))

    assert not ours.exists() and not half.exists()
    assert other.exists()
    assert plugin.is_dir() and not list(plugin.iterdir())


def test_without_dra_settings_nothing_is_touched(tmp_path: Path) -> None:
    cdi = CdiDir(tmp_path / "cdi")
    ours = cdi.write(UID, {"env": []})
    _lifecycle().remove_dra_files(None, None)
    assert ours.exists()


def test_the_prestop_hook_knows_the_gpu_operator_labels_the_agent_reads() -> None:
    """The hook (standard library only) keeps its own copy of gpushare.api.gpu_operator's
    pause values: held together here."""
    hook = _lifecycle()
    assert hook.PAUSE_LABELS == {
        UPGRADE_STATE: UPGRADE_DRAIN_STATES,
        MIG_CONFIG_STATE: MIG_DRAIN_STATES,
    }
    assert hook.PAUSED_DEPLOY_LABELS == DEPLOY_LABELS
    assert tuple(PAUSED_VALUES) == hook.PAUSED_VALUES
    assert hook.DRAIN_MARKER == DRAIN_MARKER


def test_the_prestop_hook_waits_for_the_agents_drain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = _lifecycle()
    monkeypatch.setenv("MPS_ROOT", str(tmp_path))
    monkeypatch.setenv("DRAIN_TIMEOUT_SECONDS", "2")
    (tmp_path / DRAIN_MARKER).write_text("draining\n")
    started = time.monotonic()
    hook.wait_drained()
    assert time.monotonic() - started >= 2  # never drained: waits its timeout, then goes
    (tmp_path / DRAIN_MARKER).write_text("drained\n")
    started = time.monotonic()
    hook.wait_drained()
    assert time.monotonic() - started < 1


APP, SANDBOX, OTHER = "a" * 64, "c" * 64, "d" * 64


def _pod(cid: str, annotations: dict[str, str]) -> dict[str, object]:
    return {
        "metadata": {"annotations": annotations},
        "status": {"containerStatuses": [{"containerID": f"containerd://{cid}"}]},
    }


def test_uninstall_thaws_the_pods_the_agent_paused_and_no_other(tmp_path: Path) -> None:
    """With the release gone nobody withdraws a pause: the clean-up thaws the containers of
    paused pods (cgroup v2 systemd layout here) and leaves other frozen cgroups alone."""
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    pod_dir = (
        tmp_path / "kubepods.slice" / "kubepods-besteffort.slice" / "kubepods-besteffort-pod1.slice"
    )
    cgroups = {}
    for cid in (APP, SANDBOX, OTHER):
        d = pod_dir / f"cri-containerd-{cid}.scope"
        d.mkdir(parents=True)
        (d / "cgroup.freeze").write_text("1\n")
        cgroups[cid] = d / "cgroup.freeze"
    pods = [
        _pod(APP, {"gpushare.io/paused": "{}", "gpushare.io/pause": "{}"}),
        _pod(OTHER, {}),  # frozen by someone else: not gpushare's to thaw
    ]
    assert _lifecycle().thaw_paused(pods, tmp_path) == [APP]
    assert cgroups[APP].read_text() == "0"
    assert cgroups[SANDBOX].read_text() == "1\n" and cgroups[OTHER].read_text() == "1\n"
