"""What a GpuShare's pods inherit from it: unscheduled pods its request and rules, every active
pod its measured profile once it is known -- also the pod it profiled and one placed before the
share's status reached the webhook, which placement would otherwise assume heavy for as long as
they run (an opportunistic pod was refused beside them on the local cluster: a conservative
tenant predicted it 7.67x slower, over its 2.0x bound)."""

import asyncio
from datetime import UTC, datetime
from typing import Any

from gpushare.api.gpushare_crd import ANN_PROFILE, profile_annotation
from gpushare.api.names import ANN_FRACTION, ANN_SHARE
from gpushare.api.profile import GpuProfile
from gpushare.cluster.operator.reconcile import ShareReconciler
from gpushare.cluster.operator.settings import OperatorConfig
from gpushare.cluster.state.share_rules import rules_of
from gpushare.cluster.state.view import ClusterView
from tests.fixtures.builders import pod_json

PROFILE = (
    GpuProfile.from_counters(
        {"fp16": 0.06, "fp32": 0.27, "fp64": 0.01, "tensor": 0.33, "sm_occupancy": 0.36,
         "dram_bandwidth": 0.0, "sm_utilization": 0.4},
        gpu_model="NVIDIA H100 80GB HBM3",
    )
    .stored(now=datetime(2026, 11, 25, tzinfo=UTC))
    .to_status()
)  # fmt: skip


class Annotations:
    """Records the operator's pod annotations (the only write ``_inherit`` makes)."""

    def __init__(self) -> None:
        self.written: dict[str, dict[str, str]] = {}

    async def annotate_pod(self, *, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.written.setdefault(f"{namespace}/{name}", {}).update(annotations)


def share(profile: dict[str, Any] | None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Packed" if profile else "Profiling"}
    if profile:
        status["profile"] = profile
    return {
        "metadata": {"name": "train", "namespace": "ml", "uid": "u-1"},
        "spec": {"fraction": "0.6"},
        "status": status,
    }


def inherit(profile: dict[str, Any] | None, *pods: dict[str, Any]) -> dict[str, dict[str, str]]:
    view = ClusterView()
    view.upsert_share(share(profile))
    for pod in pods:
        view.upsert_pod(pod)
    kube = Annotations()
    operator = ShareReconciler(
        config=OperatorConfig(),
        kube=kube,  # type: ignore[arg-type]  # annotate_pod is all _inherit calls
        view=view,
        profiler=None,  # type: ignore[arg-type]  # nothing is measured here
    )
    summary = view.share("ml/train")
    assert summary is not None
    asyncio.run(operator._inherit(summary, view.governed_pods(summary)))
    return kube.written


def governed(name: str, *, running: bool, **extra: str) -> dict[str, Any]:
    return pod_json(
        name,
        namespace="ml",
        annotations={ANN_SHARE: "train", **extra},
        node="node-a" if running else None,
        phase="Running" if running else "Pending",
        scheduled=True,
    )


def test_a_running_pod_of_a_profiled_share_gets_the_profile_and_placement_reads_it() -> None:
    written = inherit(PROFILE, governed("train-0", running=True, **{ANN_FRACTION: "0.6"}))
    assert written == {"ml/train-0": {ANN_PROFILE: profile_annotation(PROFILE)}}
    # The extender reads a pod's profile from that annotation: no longer assumed heavy.
    rules = rules_of(name="train-0", namespace="ml", annotations=written["ml/train-0"])
    assert rules.profile is not None and rules.profile.tensor == 0.33


def test_an_unscheduled_pod_gets_the_request_and_the_profile_a_running_one_only_the_profile() -> (
    None
):
    written = inherit(
        PROFILE,
        governed("waiting", running=False),
        governed("running", running=True, **{ANN_FRACTION: "0.6"}),
    )
    assert written["ml/waiting"][ANN_FRACTION] == "0.6"
    assert written["ml/waiting"][ANN_PROFILE] == profile_annotation(PROFILE)
    # A placed pod's request is what its GPU share was counted by: never rewritten.
    assert written["ml/running"] == {ANN_PROFILE: profile_annotation(PROFILE)}


def test_nothing_is_written_before_the_profile_or_twice() -> None:
    running = governed("train-0", running=True, **{ANN_FRACTION: "0.6"})
    assert inherit(None, running) == {}
    annotated = governed(
        "train-1", running=True, **{ANN_FRACTION: "0.6", ANN_PROFILE: profile_annotation(PROFILE)}
    )
    assert inherit(PROFILE, annotated) == {}
