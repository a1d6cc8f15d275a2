"""The GpuShare life cycle decisions: Pending -> Profiling -> Packed, from pods and status."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpushare.api.dra import ANN_DRA_GPU, POD_CLAIM
from gpushare.api.gpushare_crd import ANN_PROFILING
from gpushare.api.names import ANN_FRACTION, ANN_SHARE, RESOURCE_GPU_PERCENT
from gpushare.api.placement import Placement
from gpushare.api.profile import PLACEMENT_COUNTERS, GpuProfile
from gpushare.cluster.operator.profiling import (
    MAX_PROFILING_ATTEMPTS,
    Abandon,
    Elect,
    GiveUp,
    Measure,
    SkipProfiling,
    StartClock,
    UseCached,
    Wait,
    next_step,
    placement_entries,
    stale_marks,
    with_condition,
)
from gpushare.cluster.state.pod_facts import PodFacts, facts, kept
from gpushare.cluster.state.shares import ShareSummary, share_summary

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
GPU = "GPU-0b9c3e1a-0000-4000-8000-000000000001"
Obj = dict[str, Any]


def share(status: dict[str, Any] | None = None, **spec: Any) -> ShareSummary:
    body: dict[str, Any] = {
        "metadata": {"name": "train", "namespace": "ml", "uid": "u1", "generation": 1},
        "spec": {"fraction": "0.5", **spec},
    }
    if status is not None:
        body["status"] = status
    return share_summary(body)


def pod(
    name: str,
    *,
    minute: int = 0,
    node: str | None = None,
    phase: str = "Pending",
    annotations: dict[str, str] | None = None,
    threads: int = 50,
) -> PodFacts:
    ann = {ANN_SHARE: "train", **(annotations or {})}
    if node is not None:
        placement = Placement(
            (GPU,), threads, 40 * 2**30, T0 + timedelta(minutes=minute), "allocated"
        )
        ann.update(placement.to_annotations())
    body = {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "creationTimestamp": (T0 + timedelta(minutes=minute)).isoformat(),
            "annotations": ann,
        },
        "spec": {
            "schedulerName": "gpushare-scheduler",
            "nodeName": node,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.local/train:1",
                    "command": ["python", "train.py"],
                    "resources": {"limits": {RESOURCE_GPU_PERCENT: "50"}},
                }
            ],
        },
        "status": {"phase": phase},
    }
    return facts(body)


CACHED = GpuProfile(
    gpu_model="NVIDIA H200",
    **dict(zip(PLACEMENT_COUNTERS, (0.02, 0.05, 0.0, 0.78, 0.6, 0.4), strict=True)),
    memory_used_bytes_max=2**34,
    sampled_seconds=60.0,
    time=T0,
)


def test_new_share_waits_for_acceptance_then_for_its_first_pod() -> None:
    assert isinstance(next_step(share(), [pod("a")], cached=None, now=T0), Wait)
    step = next_step(share({"phase": "Pending"}), [], cached=None, now=T0)
    assert isinstance(step, Wait) and "no governed pod" in step.reason


def test_first_unscheduled_pod_is_elected_and_marked_so_it_runs_alone() -> None:
    pods = [pod("b", minute=2), pod("a", minute=1)]
    step = next_step(
        share({"phase": "Pending"}), sorted(pods, key=lambda p: p.created), cached=None, now=T0
    )
    assert isinstance(step, Elect)
    assert step.pod.name == "a" and step.mark


def test_interrupted_election_reuses_the_pod_already_marked() -> None:
    pods = [pod("a", minute=1), pod("b", minute=2, annotations={ANN_PROFILING: "true"})]
    step = next_step(share({"phase": "Pending"}), pods, cached=None, now=T0)
    assert isinstance(step, Elect) and step.pod.name == "b" and not step.mark


def test_when_every_pod_is_already_placed_the_oldest_is_profiled_in_place() -> None:
    pods = [pod("a", minute=1, node="n1", phase="Running")]
    step = next_step(share({"phase": "Pending"}), pods, cached=None, now=T0)
    assert isinstance(step, Elect) and not step.mark


def test_cached_profile_skips_profiling_in_auto_mode_only() -> None:
    pending = {"phase": "Pending"}
    step = next_step(share(pending), [pod("a")], cached=CACHED, now=T0)
    assert isinstance(step, UseCached) and step.profile == CACHED
    always = share(pending, profiling={"mode": "always"})
    assert isinstance(next_step(always, [pod("a")], cached=CACHED, now=T0), Elect)


def test_skip_mode_packs_without_profiling() -> None:
    skip = share({"phase": "Pending"}, profiling={"mode": "skip"})
    assert isinstance(next_step(skip, [pod("a")], cached=None, now=T0), SkipProfiling)


def test_profiling_clock_starts_when_the_pod_runs_and_measures_after_the_window() -> None:
    status: dict[str, Any] = {"phase": "Profiling", "profilingPod": "a", "profilingStarted": None}
    placed = pod("a", node="n1", phase="Running")

    waiting = next_step(share(status), [pod("a", node="n1", phase="Pending")], cached=None, now=T0)
    assert isinstance(waiting, Wait) and "not running" in waiting.reason

    start = next_step(share(status), [placed], cached=None, now=T0)
    assert isinstance(start, StartClock) and start.at == T0

    status["profilingStarted"] = "2025-03-01T12:00:00Z"
    spec = {"profiling": {"windowSeconds": 30}}
    early = next_step(share(status, **spec), [placed], cached=None, now=T0 + timedelta(seconds=29))
    assert isinstance(early, Wait)
    due = next_step(share(status, **spec), [placed], cached=None, now=T0 + timedelta(seconds=31))
    assert isinstance(due, Measure)
    assert (due.node, due.gpu_uuid, due.window_seconds) == ("n1", GPU, 30)


def test_pod_that_never_starts_is_given_up_and_another_is_elected() -> None:
    status = {
        "phase": "Profiling",
        "profilingPod": "a",
        "profilingElected": "2025-03-01T12:00:00Z",
        "profilingAttempts": 0,
    }
    stuck = pod("a", annotations={ANN_PROFILING: "true"})
    soon = next_step(share(status), [stuck], cached=None, now=T0 + timedelta(minutes=4))
    assert isinstance(soon, Wait)
    late = next_step(share(status), [stuck], cached=None, now=T0 + timedelta(minutes=6))
    assert isinstance(late, Abandon) and late.pod == stuck and "did not start" in late.reason
    tried = pod("a", minute=1, annotations={ANN_PROFILING: "done"})
    again = next_step(share({"phase": "Pending"}), [tried, pod("b", minute=2)], cached=None, now=T0)
    assert isinstance(again, Elect) and again.pod.name == "b"


def test_warmup_keeps_the_job_start_up_out_of_the_window() -> None:
    status = {"phase": "Profiling", "profilingPod": "a", "profilingStarted": "2025-03-01T12:00:00Z"}
    placed = pod("a", node="n1", phase="Running")
    spec = {"profiling": {"windowSeconds": 30}}
    warm = timedelta(seconds=10)
    at_window = T0 + timedelta(seconds=31)
    step = next_step(share(status, **spec), [placed], cached=None, now=at_window, warmup=warm)
    assert isinstance(step, Wait) and "12:00:40" in step.reason
    later = T0 + timedelta(seconds=41)
    assert isinstance(
        next_step(share(status, **spec), [placed], cached=None, now=later, warmup=warm), Measure
    )


def test_unreachable_agent_gives_up_after_the_grace_period() -> None:
    status = {"phase": "Profiling", "profilingPod": "a", "profilingStarted": "2025-03-01T12:00:00Z"}
    late = T0 + timedelta(seconds=60 + 301)
    step = next_step(share(status), [pod("a", node="n1", phase="Running")], cached=None, now=late)
    assert isinstance(step, GiveUp) and "node agent on n1" in step.reason


@pytest.mark.parametrize(
    ("pods", "words"),
    [([], "was deleted"), ([pod("a", node="n1", phase="Succeeded")], "ended (Succeeded)")],
)
def test_profiling_pod_gone_before_its_window_restarts_the_election(
    pods: list[PodFacts], words: str
) -> None:
    status = {"phase": "Profiling", "profilingPod": "a", "profilingAttempts": 0}
    step = next_step(share(status), pods, cached=None, now=T0)
    assert isinstance(step, Abandon) and words in step.reason


def test_job_shorter_than_the_window_is_packed_without_profile_after_retries() -> None:
    status = {
        "phase": "Profiling",
        "profilingPod": "a",
        "profilingAttempts": MAX_PROFILING_ATTEMPTS,
    }
    step = next_step(share(status), [], cached=None, now=T0)
    assert isinstance(step, GiveUp) and "windowSeconds" in step.reason


def test_packed_and_failed_shares_need_nothing() -> None:
    for phase in ("Packed", "Failed"):
        assert isinstance(next_step(share({"phase": phase}), [pod("a")], cached=None, now=T0), Wait)


def test_marks_are_released_once_the_pod_is_no_longer_profiling() -> None:
    marked = pod("a", node="n1", phase="Running", annotations={ANN_PROFILING: "true"})
    profiling = share({"phase": "Profiling", "profilingPod": "a"})
    assert stale_marks(profiling, [marked]) == []
    assert stale_marks(share({"phase": "Packed"}), [marked]) == [marked]
    abandoned = share({"phase": "Profiling", "profilingPod": "b"})
    assert stale_marks(abandoned, [marked]) == [marked]


def test_placements_list_only_pods_holding_a_gpu() -> None:
    entries = placement_entries(
        [
            pod("a", node="n1", phase="Running", threads=30),
            pod("b"),
            pod("c", node="n1", phase="Succeeded"),
        ]
    )
    assert [(e.pod, e.gpu_uuid, e.thread_percent) for e in entries] == [("a", GPU, 30)]


def test_condition_transition_time_moves_only_when_status_flips() -> None:
    first = with_condition(
        [], type_="Profiled", status=False, reason="Profiling", message="m", now=T0
    )
    later = T0 + timedelta(minutes=5)
    same = with_condition(
        first, type_="Profiled", status=False, reason="Again", message="m2", now=later
    )
    assert same[0]["lastTransitionTime"] == first[0]["lastTransitionTime"]
    assert same[0]["reason"] == "Again"
    flipped = with_condition(
        same, type_="Profiled", status=True, reason="Measured", message="ok", now=later
    )
    assert flipped[0]["lastTransitionTime"] == "2025-03-01T12:05:00Z"
    assert len(flipped) == 1


def dra_pod(name: str, *, node: str | None = None, phase: str = "Pending", **ann: str) -> Obj:
    """A pod as the DRA-mode webhook leaves it: its claim, gated until the controller places
    it, ``gpushare.io/dra-gpu`` once placed."""
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "creationTimestamp": T0.isoformat(),
            "annotations": {ANN_SHARE: "train", **ann},
        },
        "spec": {
            "nodeName": node,
            "resourceClaims": [{"name": POD_CLAIM, "resourceClaimTemplateName": "gpushare-50pct"}],
            "containers": [{"name": "main", "image": "registry.local/train:1"}],
        },
        "status": {"phase": phase},
    }


def test_a_dra_pod_linking_a_share_is_governed_and_profiled_on_its_claims_gpu() -> None:
    gated = facts(dra_pod("a"))
    assert gated.dra and kept(gated) and gated.gpu_pod
    assert gated.demand is None and gated.placement is None  # the claim allocator places it
    assert gated.profiled_gpu is None

    running = facts(dra_pod("a", node="n1", phase="Running", **{ANN_DRA_GPU: GPU}))
    assert running.profiled_gpu == GPU and running.gpu_uuid is None
    status = {"phase": "Profiling", "profilingPod": "a", "profilingStarted": "2025-03-01T12:00:00Z"}
    due = next_step(
        share(status, profiling={"windowSeconds": 30}),
        [running],
        cached=None,
        now=T0 + timedelta(seconds=31),
    )
    assert isinstance(due, Measure)
    assert (due.node, due.gpu_uuid) == ("n1", GPU)


def test_a_dra_pod_without_a_share_is_not_kept_and_its_gpu_annotation_is_not_read() -> None:
    body = dra_pod("a", **{ANN_DRA_GPU: GPU})
    del body["metadata"]["annotations"][ANN_SHARE]
    body["metadata"]["annotations"][ANN_FRACTION] = "0.5"
    plain = facts(body)
    assert plain.dra and not kept(plain)
    assert plain.profiled_gpu is None
