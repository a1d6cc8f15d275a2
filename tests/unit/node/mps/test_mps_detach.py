"""Moving MPS daemons out of the agent's container: the flag refuses a cgroup path, and a host
that refuses the move is reported (the daemon keeps running in the agent's cgroup)."""

from pathlib import Path

import pytest

from gpushare.node.main import build_parser
from gpushare.node.mps.detach import DetachError, check_cgroup_name, detach


@pytest.mark.parametrize("bad", ["", "../escape", "a/b", ".hidden", "x" * 65, "sp ace"])
def test_the_cgroup_must_be_one_plain_name(bad: str) -> None:
    with pytest.raises(ValueError, match="--mps-cgroup must be one cgroup name"):
        check_cgroup_name(bad)


def test_the_agent_flag_takes_a_name_and_refuses_a_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(["--mps-cgroup", "gpushare-mps"]).mps_cgroup == "gpushare-mps"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--mps-cgroup", "/sys/fs/cgroup/x"])
    assert "--mps-cgroup must be one cgroup name" in capsys.readouterr().err


def test_a_refused_move_names_the_pid_and_the_cgroup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An nsenter that fails as a host without cgroup v2 or privileges would.
    fake = tmp_path / "nsenter"
    fake.write_text("#!/bin/sh\necho 'nsenter: reassociate to namespaces failed' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with pytest.raises(DetachError, match="moving pid 4242 to cgroup /gpushare-mps failed"):
        detach(4242, cgroup="gpushare-mps")
