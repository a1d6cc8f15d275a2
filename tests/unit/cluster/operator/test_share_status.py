"""The status patch of one GpuShare transition: it applies only while the share is still in the
phase (and the fields) the operator read, so two racing ticks or a restart change nothing twice
(docs/operator.md, "Life cycle")."""

import asyncio
import dataclasses
from datetime import UTC, datetime
from typing import Any

from gpushare.api.inventory import GpuInfo
from gpushare.api.profile import GpuProfile
from gpushare.cluster.operator.profiling import UseCached
from gpushare.cluster.operator.reconcile import ShareReconciler
from gpushare.cluster.operator.settings import OperatorConfig
from gpushare.cluster.operator.share_status import (
    describe,
    profiling_place,
    sized_fields,
    sized_note,
    transition_ops,
)
from gpushare.cluster.state.shares import share_summary
from gpushare.cluster.state.view import ClusterView
from gpushare.packing.model import GpuState, NodeState
from tests.fixtures.builders import node_json
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


GiB = 2**30


def nodes(*memories: int, healthy: bool = True) -> dict[str, NodeState]:
    gpus = [GpuState(uuid=f"g{i}", memory_bytes=m, healthy=healthy) for i, m in enumerate(memories)]
    return {"n": NodeState(name="n", gpus=gpus)}


def auto_share(**spec: Any) -> Any:
    return share_summary(
        {"metadata": {"name": "llm", "namespace": "ml"}, "spec": {"fraction": "auto", **spec}}
    )


def test_the_profiled_event_warns_when_a_sized_share_gives_less_memory_than_the_job_used() -> None:
    # A job with a large model and little compute (a notebook's counters, 30 GiB at its peak)
    # is sized to 5%: its pods' MPS memory limit would be 4 GiB of an 80 GiB GPU.
    profile = dataclasses.replace(
        GpuProfile.from_counters(NOTEBOOK_COUNTERS, gpu_model="NVIDIA H100"),
        memory_used_bytes_max=30 * GiB,
    ).stored(now=NOW)
    share = auto_share()
    fields = sized_fields(share, profile)
    assert fields == {"request": "0.05"}
    note = sized_note(fields, share, profile, nodes(141 * GiB, 80 * GiB))
    assert note.startswith("; fraction auto: pods created from now on ask for 0.05 of a GPU")
    assert "30.0 GiB" in note and "(4.0 GiB of 80.0 GiB)" in note
    assert "set spec.memory to at least 38Gi" in note  # 30 GiB x 1.25, rounded up


def test_no_memory_warning_where_the_share_is_enough_or_the_user_chose() -> None:
    small = dataclasses.replace(
        GpuProfile.from_counters(NOTEBOOK_COUNTERS, gpu_model="NVIDIA H100"),
        memory_used_bytes_max=2 * GiB,
    ).stored(now=NOW)
    large = dataclasses.replace(small, memory_used_bytes_max=30 * GiB)
    plain = "; fraction auto: pods created from now on ask for 0.05 of a GPU"
    share = auto_share()
    assert sized_note(sized_fields(share, small), share, small, nodes(80 * GiB)) == plain
    assert sized_note(sized_fields(share, large), share, large, {}) == plain  # no GPU known
    unhealthy = nodes(80 * GiB, healthy=False)
    assert sized_note(sized_fields(share, large), share, large, unhealthy) == plain
    pinned = auto_share(memory="40Gi")
    assert sized_note(sized_fields(pinned, large), pinned, large, nodes(80 * GiB)) == plain
    stated = share_summary(body(None))  # fraction 0.5: nothing sized, nothing said
    assert sized_note(sized_fields(stated, large), stated, large, nodes(80 * GiB)) == ""


class Recorder:
    """The operator's status patches and Events, as a Kubernetes API that accepts them."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.patches: list[list[dict[str, Any]]] = []

    async def patch_share_status(self, *, ops: list[dict[str, Any]], **_: Any) -> bool:
        self.patches.append(ops)
        return True

    async def post_event(self, *, message: str, **_: Any) -> None:
        self.events.append(message)


def test_the_operator_says_so_in_the_event_against_the_clusters_gpus() -> None:
    # The reconciler reads the GPUs the node agents announced: on an 80 GiB GPU a 5% share is
    # 4 GiB, less than the 30 GiB the cached profile saw.
    view = ClusterView()
    gpu = GpuInfo("g0", 0, "NVIDIA H100", 80 * GiB, sm_count=132, compute_capability="9.0")
    view.upsert_node(node_json("node-a", [gpu]))
    view.upsert_share(
        {"metadata": {"name": "llm", "namespace": "ml", "uid": "u"}, "spec": {"fraction": "auto"}}
    )
    kube = Recorder()
    operator = ShareReconciler(
        config=OperatorConfig(),
        kube=kube,  # type: ignore[arg-type]  # status patches and events are all it sends here
        view=view,
        profiler=None,  # type: ignore[arg-type]  # nothing is measured here
    )
    profile = dataclasses.replace(
        GpuProfile.from_counters(NOTEBOOK_COUNTERS, gpu_model="NVIDIA H100"),
        memory_used_bytes_max=30 * GiB,
    ).stored(now=NOW)
    summary = view.share("ml/llm")
    assert summary is not None
    asyncio.run(operator._use_cached(summary, UseCached(profile), now=NOW))
    assert len(kube.events) == 1
    assert "set spec.memory to at least 38Gi" in kube.events[0]
    assert "(4.0 GiB of 80.0 GiB)" in kube.events[0]
    # kubectl describe shows it too: the Profiled condition carries the same words.
    [status] = [op["value"] for op in kube.patches[0] if op["op"] == "add"]  # its first status
    conditions = status["conditions"]
    [profiled] = [c for c in conditions if c["type"] == "Profiled"]
    assert "set spec.memory to at least 38Gi" in profiled["message"]
