"""Where a pod's containers' cgroups are, under both kubelet cgroup drivers, every QoS class and
both cgroup versions, and how their freezer files are read and written (gpushare.node.pausing.
freezer). The trees here are laid out as the kubelet and runc lay them out; the kernel's own
behaviour is proven on the local cluster (tests/cluster/test_pause_cluster.py)."""

from pathlib import Path

import pytest

from gpushare.node.core.cgroups import container_cgroup_id, is_pod_cgroup_name, pod_cgroup_dirs
from gpushare.node.pausing.decisions import FreezeState
from gpushare.node.pausing.freezer import (
    NO_CGROUP_FS,
    NOT_SETTLED,
    WRITE_FAILED,
    FreezeError,
    Freezer,
    find_hierarchy,
)

UID = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"
APP = "a" * 64
SIDE = "b" * 64
SANDBOX = "c" * 64


def test_pod_dirs_cover_both_drivers_at_the_pods_qos_class() -> None:
    assert pod_cgroup_dirs(UID, "Burstable") == [
        f"kubepods/burstable/pod{UID}",
        "kubepods.slice/kubepods-burstable.slice/"
        "kubepods-burstable-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice",
    ]
    # Guaranteed pods sit directly under kubepods.
    assert pod_cgroup_dirs(UID, "Guaranteed") == [
        f"kubepods/pod{UID}",
        "kubepods.slice/kubepods-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice",
    ]
    assert len(pod_cgroup_dirs(UID, None)) == 6
    assert f"kubepods/besteffort/pod{UID}" in pod_cgroup_dirs(UID, None)


def test_container_ids_are_read_from_either_drivers_names() -> None:
    assert container_cgroup_id(APP) == APP
    assert container_cgroup_id(f"cri-containerd-{APP}.scope") == APP
    assert container_cgroup_id(f"crio-{APP}.scope") == APP
    assert container_cgroup_id("cgroup.procs") is None
    assert container_cgroup_id(f"pod{UID}") is None
    assert is_pod_cgroup_name(f"pod{UID}", UID)
    assert is_pod_cgroup_name("kubelet-kubepods-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice", UID)
    assert not is_pod_cgroup_name(f"pod{UID}x", UID)


def v1_tree(root: Path, pod_dir: str, names: list[str]) -> dict[str, Path]:
    """The v1 freezer hierarchy with one pod: each container cgroup a freezer.state file."""
    (root / "freezer").mkdir(parents=True)
    (root / "freezer" / "cgroup.procs").write_text("")
    out = {}
    for name in names:
        d = root / "freezer" / pod_dir / name
        d.mkdir(parents=True)
        (d / "freezer.state").write_text("THAWED\n")
        out[name] = d
    return out


def v2_tree(root: Path, pod_dir: str, names: list[str], frozen: str = "0") -> dict[str, Path]:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    out = {}
    for name in names:
        d = root / pod_dir / name
        d.mkdir(parents=True)
        (d / "cgroup.freeze").write_text(frozen + "\n")
        (d / "cgroup.events").write_text(f"populated 1\nfrozen {frozen}\n")
        out[name] = d
    return out


@pytest.mark.parametrize(
    ("pod_dir", "names"),
    [
        (f"kubepods/besteffort/pod{UID}", [APP, SIDE, SANDBOX]),
        (f"kubepods/pod{UID}", [APP, SIDE, SANDBOX]),
        (
            "kubepods.slice/kubepods-burstable.slice/"
            "kubepods-burstable-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice",
            [f"cri-containerd-{c}.scope" for c in (APP, SIDE, SANDBOX)],
        ),
    ],
)
def test_a_pods_containers_are_found_and_its_sandbox_left_out(
    tmp_path: Path, pod_dir: str, names: list[str]
) -> None:
    v1_tree(tmp_path, pod_dir, names)
    found = Freezer(tmp_path).containers(UID, qos=None, container_ids=[APP, SIDE])
    assert set(found) == {APP, SIDE}
    assert all(p.parent == tmp_path / "freezer" / pod_dir for p in found.values())


def test_a_kubelet_with_another_cgroup_root_is_found_by_searching(tmp_path: Path) -> None:
    pod_dir = (
        "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        "kubelet-kubepods-besteffort-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice"
    )
    v2_tree(tmp_path, pod_dir, [f"cri-containerd-{APP}.scope"])
    found = Freezer(tmp_path).containers(UID, qos="BestEffort", container_ids=[APP])
    assert list(found) == [APP]


def test_a_missing_cgroup_fs_says_what_to_mount(tmp_path: Path) -> None:
    assert find_hierarchy(tmp_path) is None
    with pytest.raises(FreezeError) as err:
        Freezer(tmp_path).containers(UID, qos=None, container_ids=[APP])
    assert err.value.reason == NO_CGROUP_FS
    assert "--cgroup-root" in str(err.value)


def test_v1_freeze_writes_frozen_and_thaw_thawed(tmp_path: Path) -> None:
    cgroups = v1_tree(tmp_path, f"kubepods/pod{UID}", [APP, SIDE])
    freezer = Freezer(tmp_path, settle_s=0.2)
    by_id = {APP: cgroups[APP], SIDE: cgroups[SIDE]}
    assert freezer.state(by_id) is FreezeState.THAWED
    freezer.freeze(by_id)
    assert (cgroups[APP] / "freezer.state").read_text() == "FROZEN"
    assert freezer.state(by_id) is FreezeState.FROZEN
    (cgroups[SIDE] / "freezer.state").write_text("THAWED\n")
    assert freezer.state(by_id) is FreezeState.PARTLY
    freezer.thaw(by_id)
    assert freezer.state(by_id) is FreezeState.THAWED


def test_v2_state_is_read_from_cgroup_events_not_from_the_request(tmp_path: Path) -> None:
    cgroups = v2_tree(tmp_path, f"kubepods/burstable/pod{UID}", [APP])
    freezer = Freezer(tmp_path, settle_s=0.05)
    (cgroups[APP] / "cgroup.freeze").write_text("1\n")  # asked, not in effect yet
    assert freezer.state({APP: cgroups[APP]}) is FreezeState.THAWED
    (cgroups[APP] / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    assert freezer.state({APP: cgroups[APP]}) is FreezeState.FROZEN


def test_a_v2_freeze_that_never_takes_effect_fails_and_is_undone(tmp_path: Path) -> None:
    cgroups = v2_tree(tmp_path, f"kubepods/burstable/pod{UID}", [APP])
    freezer = Freezer(tmp_path, settle_s=0.05)
    with pytest.raises(FreezeError) as err:
        freezer.freeze({APP: cgroups[APP]})
    assert err.value.reason == NOT_SETTLED
    assert "not frozen within" in str(err.value)
    # Rolled back: the pod is not left asking to be half frozen.
    assert (cgroups[APP] / "cgroup.freeze").read_text() == "0"


def test_a_control_file_that_cannot_be_written_names_the_fix(tmp_path: Path) -> None:
    cgroups = v1_tree(tmp_path, f"kubepods/pod{UID}", [APP])
    state = cgroups[APP] / "freezer.state"
    state.unlink()
    state.mkdir()  # writing it fails with EISDIR, as a read-only mount fails with EROFS
    with pytest.raises(FreezeError) as err:
        Freezer(tmp_path, settle_s=0.05).freeze({APP: cgroups[APP]})
    assert err.value.reason == WRITE_FAILED
    assert "cgroup fs mounted writable" in str(err.value)
