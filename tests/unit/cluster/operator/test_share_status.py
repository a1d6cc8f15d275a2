"""The status patch of one GpuShare transition: it applies only while the share is still in the
phase (and the fields) the operator read, so two racing ticks or a restart change nothing twice
(docs/operator.md, "Life cycle")."""

from datetime import UTC, datetime
from typing import Any

from gpushare.api.profile import GpuProfile
from gpushare.cluster.operator.share_status import describe, profiling_place, transition_ops
from gpushare.cluster.state.shares import share_summary
from tests.unit.packing.h200_profiles import NOTEBOOK_COUNTERS

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def body(status: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "metadata": {"name": "train", "namespace": "ml", "uid": "u", "generation": 3},
        "spec": {"fraction": "0.5"},
    }
    if status is not None:
        out["status"] = status
    return out


def test_a_first_status_is_added_only_while_there_is_none() -> None:
    ops = transition_ops(share_summary(body(None)), to_phase="Pending", now=NOW)
    assert ops[0] == {"op": "test", "path": "/status", "value": None}
    assert ops[1]["op"] == "add" and ops[1]["path"] == "/status"
    assert ops[1]["value"] == {"phase": "Pending", "observedGeneration": 3}


def test_a_transition_tests_the_phase_and_fields_it_read_and_sets_the_condition() -> None:
    share = share_summary(body({"phase": "Profiling", "profilingPod": "train-0"}))
    ops = transition_ops(
        share,
        to_phase="Packed",
        fields={"profile": {"gpuModel": "H100"}},
        tests={"profilingPod": "train-0"},
        condition=("Profiled", True, "Measured", "profiled pod train-0"),
        now=NOW,
    )
    tests = [op for op in ops if op["op"] == "test"]
    assert tests == [
        {"op": "test", "path": "/status/phase", "value": "Profiling"},
        {"op": "test", "path": "/status/profilingPod", "value": "train-0"},
    ]
    added = {op["path"]: op["value"] for op in ops if op["op"] == "add"}
    assert added["/status/phase"] == "Packed"
    assert added["/status/profile"] == {"gpuModel": "H100"}
    (condition,) = added["/status/conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "Profiled",
        "True",
        "Measured",
    )
    assert condition["observedGeneration"] == 3


def test_profiling_started_promises_only_the_place_the_pod_will_get() -> None:
    """ "Alone on a GPU" only where the extender keeps others off it: a marked pod, a policy
    other than aggressive, and the namespace's grant (issue 68: the event said alone when the
    pod shared a GPU)."""
    alone = profiling_place(policy="cautious", granted=True, marked=True, node=None)
    assert alone == "alone on a GPU (policy cautious)"
    light = profiling_place(policy="aggressive", granted=True, marked=True, node=None)
    assert light.startswith("on a lightly loaded GPU (at most 25% allocated")
    shared = profiling_place(policy="exclusive", granted=False, marked=True, node=None)
    assert "alone" not in shared and "gpushare.io/neighbour-rules=granted" in shared
    running = profiling_place(policy="cautious", granted=True, marked=False, node="n1")
    assert running == "where it already runs (on n1; neighbours may skew the profile)"


def test_the_profiled_event_says_how_much_of_its_time_the_job_ran_kernels() -> None:
    # A notebook between cells: next to no work, and a kernel on the GPU 7% of the time.
    notebook = GpuProfile.from_counters(NOTEBOOK_COUNTERS, gpu_model="NVIDIA H200")
    assert "kernel time 7%" in describe(notebook)
