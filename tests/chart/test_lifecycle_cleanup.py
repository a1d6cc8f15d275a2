"""What the node agent's preStop clean-up removes on uninstall in DRA mode: the claims' CDI specs
the agent wrote (named as the agent names them) and the plugin's socket and checkpoint; another
vendor's specs in the same directory stay."""

import json
from pathlib import Path
from types import ModuleType

from gpushare.node.dra.cdi import CdiDir
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
