"""Which GPUs gpushare manages beside other device plugins: --gpus, MIG, other plugins'
GPUs; the agent then sees only the managed ones (docs/coexistence.md)."""

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.node.coexistence import OtherPluginWatch, other_plugin_gpus
from gpushare.node.core.health import DeviceHealth
from gpushare.node.gpu.selection import (
    REASON_MIG,
    REASON_NOT_SELECTED,
    REASON_OTHER_PLUGIN,
    parse_gpu_list,
    select_gpus,
)
from gpushare.node.gpu.simulated import SimulatedBackend, parse_spec
from gpushare.node.main import main

SPEC = "3xH100-80GB,1xA100-80GB+mig"


def backend() -> SimulatedBackend:
    return SimulatedBackend(SPEC, node_name="n1")


def test_gpu_list_takes_indexes_and_uuids_and_refuses_the_rest() -> None:
    assert parse_gpu_list("all") is None and parse_gpu_list(" ") is None
    listed = parse_gpu_list("0, 2,GPU-8d3c1f0a-0000-4000-8000-000000000001")
    assert listed is not None
    assert listed.indexes == {0, 2}
    assert listed.uuids == {"GPU-8d3c1f0a-0000-4000-8000-000000000001"}
    with pytest.raises(InvalidInputError) as err:
        parse_gpu_list("0,first")
    assert "--gpus" in str(err.value) and "'first'" in str(err.value)


def test_simulated_spec_marks_mig_gpus() -> None:
    b = backend()
    assert [b.mig_enabled(g.uuid) for g in b.inventory()] == [False, False, False, True]
    assert len(parse_spec(SPEC)) == 4
    with pytest.raises(InvalidInputError):
        parse_spec("1xH100-80GB+mog")


def test_mig_not_selected_and_other_plugins_gpus_are_left_out_with_the_reason() -> None:
    b = backend()
    gpus = b.inventory()
    selected, skipped = select_gpus(
        b,
        wanted=parse_gpu_list("0,1,3"),  # 2 not listed; 3 is the MIG GPU
        other_plugins={gpus[0].uuid: "nvidia.com/gpu"},
    )
    assert [g.index for g in selected.inventory()] == [1]
    reasons = {s.gpu.index: s.reason for s in skipped}
    assert reasons == {0: REASON_OTHER_PLUGIN, 2: REASON_NOT_SELECTED, 3: REASON_MIG}
    by_index = {s.gpu.index: s.message for s in skipped}
    assert "nvidia.com/gpu" in by_index[0] and "MIG" in by_index[3]
    # The rest of the agent cannot reach a left-out GPU by mistake.
    with pytest.raises(KeyError, match="not managed"):
        selected.sample(gpus[0].uuid)
    assert selected.sample(gpus[1].uuid).uuid == gpus[1].uuid
    # Optional backend methods pass through (the agent feeds simulated load this way).
    assert selected.set_load is not None  # type: ignore[attr-defined]
    assert selected.simulated is True


def test_nothing_to_leave_out_keeps_the_backend() -> None:
    b = SimulatedBackend("2xH100-80GB", node_name="n1")
    selected, skipped = select_gpus(b, wanted=None, other_plugins={})
    assert selected is b and skipped == []


def test_other_plugins_gpus_are_found_by_uuid_or_nvidia_index() -> None:
    gpus = backend().inventory()
    advertised = [
        ("gpushare.io/gpu-percent", (f"{gpus[1].uuid}::07",)),  # ours: never a conflict
        ("nvidia.com/gpu", (f"{gpus[0].uuid}::0", f"{gpus[0].uuid}::1")),  # time-slicing
        ("nvidia.com/gpu.shared", ("2",)),  # deviceIDStrategy: index
        ("example.com/fpga", ("3",)),  # another vendor's numbering, not our GPU 3
    ]
    assert other_plugin_gpus(gpus, advertised) == {
        gpus[0].uuid: "nvidia.com/gpu",
        gpus[2].uuid: "nvidia.com/gpu.shared",
    }


def test_a_plugin_that_registers_later_takes_the_gpu_out_of_service_until_it_leaves() -> None:
    gpus = backend().inventory()[:2]
    health = DeviceHealth(g.uuid for g in gpus)
    events: list[tuple[str, bool]] = []
    advertised: list[tuple[str, tuple[str, ...]]] = []
    watch = OtherPluginWatch(
        gpus=gpus,
        socket_path=None,  # type: ignore[arg-type]  # the kubelet is replaced below
        set_problem=lambda uuid, p: health.set_problem(uuid, "other-device-plugin", p),
        record=lambda reason, _msg, warning: events.append((reason, warning)),
        advertised=lambda: advertised,
    )
    assert watch.check_once() == {}
    advertised.append(("nvidia.com/gpu", (gpus[1].uuid,)))
    watch.check_once()
    assert health.healthy(gpus[0].uuid) and not health.healthy(gpus[1].uuid)
    watch.check_once()  # still claimed: one Event, not one per check
    assert events == [("GpuAdvertisedByOtherPlugin", True)]
    advertised.clear()
    watch.check_once()
    assert health.healthy(gpus[1].uuid)
    assert events[-1] == ("GpuNoLongerAdvertisedByOtherPlugin", False)


def test_agent_refuses_a_bad_gpu_list_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--backend", "simulated:1xH100-80GB", "--node-name", "n1", "--gpus", "0;1"])
    assert code == 2
    assert "--gpus" in capsys.readouterr().err


def test_node_label_selects_gpus_by_index_or_none() -> None:
    from gpushare.node.gpu.selection import parse_gpu_label  # noqa: PLC0415

    assert parse_gpu_label("all") is None
    listed = parse_gpu_label("0_3")
    assert listed is not None and listed.indexes == {0, 3}
    nothing = parse_gpu_label("none")
    assert nothing is not None and not nothing.indexes and not nothing.uuids
    b = backend()
    selected, skipped = select_gpus(b, wanted=nothing, other_plugins={})
    assert selected.inventory() == [] and len(skipped) == 4
    with pytest.raises(InvalidInputError) as err:
        parse_gpu_label("0,1")
    assert "gpushare.io/managed-gpus" in str(err.value)
