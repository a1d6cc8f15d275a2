"""The simulated backend: looks like real GPUs, says it is not, and reports the load it is fed."""

import logging

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.api.profile import PIPES
from gpushare.node.gpu.factory import open_backend
from gpushare.node.gpu.simulated import SimulatedBackend, parse_spec


def test_spec_gives_gpus_of_the_named_models_in_order() -> None:
    gpus = SimulatedBackend("2xH100-80GB,1xL4", node_name="n1").inventory()
    assert [g.model for g in gpus] == ["NVIDIA H100 80GB HBM3"] * 2 + ["NVIDIA L4"]
    assert [g.index for g in gpus] == [0, 1, 2]
    assert gpus[0].sm_count == 132 and gpus[0].compute_capability == "9.0"
    assert all(g.simulated for g in gpus)


def test_uuids_are_stable_per_node_and_distinct_across_nodes() -> None:
    first = [g.uuid for g in SimulatedBackend("2xH100-80GB", node_name="n1").inventory()]
    again = [g.uuid for g in SimulatedBackend("2xH100-80GB", node_name="n1").inventory()]
    other = [g.uuid for g in SimulatedBackend("2xH100-80GB", node_name="n2").inventory()]
    assert first == again
    assert not set(first) & set(other)
    assert all(u.startswith("GPU-") and len(u) == 40 for u in first)


def test_it_announces_itself(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        backend = SimulatedBackend("1xT4", node_name="n1")
    assert backend.simulated and backend.name == "simulated"
    assert any("SIMULATED" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [("3xB9000", "unknown GPU model"), ("2x H100", "not <count>x<model>"), ("40xL4", "1..16")],
)
def test_bad_specs_name_the_flag_and_the_fix(spec: str, problem: str) -> None:
    with pytest.raises(InvalidInputError, match=problem) as err:
        parse_spec(spec)
    assert err.value.field == "--backend simulated:<spec>"
    assert "H100-80GB" in err.value.fix


def test_unknown_backend_names_the_flag() -> None:
    with pytest.raises(InvalidInputError, match="--backend"):
        open_backend("cuda", node_name="n1")


def test_sample_reports_the_load_it_was_given() -> None:
    backend = SimulatedBackend("1xH100-80GB", node_name="n1")
    uuid = backend.inventory()[0].uuid
    idle = backend.sample(uuid)
    assert idle.pipes == dict.fromkeys(PIPES, 0.0) and idle.memory_used_bytes == 0
    backend.set_load(
        uuid, pipes={"tensor_hmma": 0.6, "fp32": 1.7}, sm_occupancy=0.4, memory_used_bytes=2**33
    )
    busy = backend.sample(uuid)
    assert busy.pipes["tensor_hmma"] == 0.6
    assert busy.pipes["fp32"] == 1.0  # clamped to a ratio
    assert busy.sm_occupancy_ratio == 0.4
    assert busy.memory_used_bytes == 2**33
    assert busy.memory_total_bytes == backend.inventory()[0].memory_bytes
    with pytest.raises(ValueError, match="unknown pipe"):
        backend.set_load(uuid, pipes={"warp": 0.1}, sm_occupancy=0, memory_used_bytes=0)


def test_injected_health_events_are_delivered_once() -> None:
    backend = SimulatedBackend("2xL4", node_name="n1")
    uuid = backend.inventory()[1].uuid
    assert backend.wait_health_events(0.01) == []
    backend.inject_health(uuid, healthy=False, reason="XID 79", xid=79)
    events = backend.wait_health_events(1.0)
    assert [(e.uuid, e.healthy, e.xid) for e in events] == [(uuid, False, 79)]
    assert backend.wait_health_events(0.01) == []
