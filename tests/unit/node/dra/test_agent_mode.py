"""The node agent's --mode dra: the flags, and an agent that publishes its ResourceSlice and
serves the DRA plugin instead of the device plugin."""

from collections.abc import Mapping
from pathlib import Path

import pytest

from gpushare.api.dra import DRIVER
from gpushare.node.agent import AgentSettings, NodeAgent
from gpushare.node.main import build_parser
from tests.unit.node.dra.helpers import NODE, FakeClaims, FakeSlices, backend


class FakeDraKube(FakeClaims, FakeSlices):
    def __init__(self) -> None:
        FakeClaims.__init__(self)
        FakeSlices.__init__(self)


class FakeNodeKube:
    def __init__(self) -> None:
        self.published: list[Mapping[str, str]] = []

    def publish_node(
        self, *, annotations: Mapping[str, str], labels: Mapping[str, str | None]
    ) -> None:
        self.published.append(annotations)


def test_mode_and_cdi_dir_are_flags_with_deviceplugin_the_default() -> None:
    defaults = build_parser().parse_args([])
    assert (defaults.mode, defaults.cdi_dir) == ("deviceplugin", Path("/var/run/cdi"))
    args = build_parser().parse_args(
        ["--mode", "dra", "--cdi-dir", "/etc/cdi", "--kubelet-root", "/k"]
    )
    assert (args.mode, args.cdi_dir, args.kubelet_root) == ("dra", Path("/etc/cdi"), Path("/k"))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--mode", "both"])


def test_a_dra_agent_publishes_its_slice_and_serves_the_dra_plugin(tmp_path: Path) -> None:
    dra = FakeDraKube()
    kube = FakeNodeKube()
    settings = AgentSettings(
        node_name=NODE,
        mode="dra",
        mps_root=tmp_path / "mps",
        kubelet_root=tmp_path / "kubelet",
        cdi_dir=tmp_path / "cdi",
    )
    agent = NodeAgent(settings, backend=backend(), kube=kube, dra_kube=dra)
    agent.mps.ensure(g.uuid for g in agent.gpus)
    agent.publish()
    assert kube.published, "the node inventory is still published in dra mode"
    (stored,) = dra.slices.values()
    assert stored["spec"]["driver"] == DRIVER
    assert [d["name"] for d in stored["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    assert agent.dra_runner is not None
    assert agent.dra_runner.socket_path == tmp_path / "kubelet/plugins" / DRIVER / "dra.sock"


def test_a_deviceplugin_agent_has_no_dra_parts(tmp_path: Path) -> None:
    agent = NodeAgent(
        AgentSettings(node_name=NODE, mps_root=tmp_path), backend=backend(), kube=None
    )
    assert agent.dra is None and agent.dra_runner is None and agent.slices is None
