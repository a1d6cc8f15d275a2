"""``fraction: auto``: a GpuShare's pods ask for what gpushare sizes from its stored profile.

Before the share has a profile its pods ask for a whole GPU (the first one is profiled alone);
afterwards the webhook gives each new linked pod the sized request; a damaged status costs the
sizing, never the watch."""

import dataclasses
from datetime import UTC, datetime
from typing import Any

from gpushare.api.gpushare_crd import inherited_annotations
from gpushare.api.names import ANN_FRACTION, ANN_SHARE, RESOURCE_GPU_PERCENT
from gpushare.api.profile import GpuProfile
from gpushare.cluster.state.shares import ShareRegistry, share_summary
from gpushare.cluster.webhook.review import review
from gpushare.packing.sizing import suggested_percent
from gpushare.packing.stored_profile import pipe_profile
from tests.fixtures.builders import apply_patch, pod_json, webhook_facts

# A ResNet-50-like job measured alone on an H200: busy SMs, half the occupancy and DRAM.
PROFILE = GpuProfile(
    gpu_model="NVIDIA H200",
    fp16=0.0,
    fp32=0.03,
    fp64=0.0,
    tensor=0.12,
    sm_occupancy=0.47,
    dram_bandwidth=0.41,
    memory_used_bytes_max=None,
    sampled_seconds=60,
    time=datetime(2026, 11, 24, tzinfo=UTC),
    sm_utilization=0.84,
)


def share(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": "train", "namespace": "ml"}, "spec": spec}
    if status is not None:
        body["status"] = status
    return body


def linked_pod_percent(registry: ShareRegistry) -> str:
    facts = dataclasses.replace(webhook_facts(), share_lookup=registry.request)
    pod = pod_json("p", namespace="ml", annotations={ANN_SHARE: "train"})
    verdict = review(pod, namespace="ml", facts=facts, mutate=True)
    assert verdict.allowed, verdict.message
    limits = apply_patch(pod, verdict.patch)["spec"]["containers"][0]["resources"]["limits"]
    return str(limits[RESOURCE_GPU_PERCENT])


def test_an_auto_share_asks_for_a_whole_gpu_until_it_has_a_profile() -> None:
    registry = ShareRegistry()
    registry.upsert(share({"fraction": "auto"}, {"phase": "Profiling"}))
    assert linked_pod_percent(registry) == "100"
    assert registry.by_key["ml/train"].sized_fraction == "1"


def test_once_profiled_new_pods_of_an_auto_share_ask_for_the_sized_share() -> None:
    registry = ShareRegistry()
    registry.upsert(
        share({"fraction": "auto"}, {"phase": "Packed", "profile": PROFILE.to_status()})
    )
    expected = suggested_percent(pipe_profile(PROFILE), gpu_class="batch")
    assert expected == 60
    assert linked_pod_percent(registry) == "60"
    assert registry.by_key["ml/train"].sized_fraction == "0.6"


def test_a_stated_fraction_is_never_resized_by_the_profile() -> None:
    registry = ShareRegistry()
    registry.upsert(share({"fraction": "0.3"}, {"phase": "Packed", "profile": PROFILE.to_status()}))
    assert linked_pod_percent(registry) == "30"
    assert registry.by_key["ml/train"].sized_fraction is None


def test_a_damaged_profile_in_status_leaves_the_whole_gpu_and_keeps_the_watch() -> None:
    registry = ShareRegistry()
    damaged = {**PROFILE.to_status(), "tensor": "lots"}
    summary = registry.upsert(share({"fraction": "auto"}, {"phase": "Packed", "profile": damaged}))
    assert summary is not None and summary.spec is not None
    assert linked_pod_percent(registry) == "100"


def test_an_auto_share_gives_its_pods_no_fraction_annotation_to_contradict_their_request() -> None:
    spec = share_summary(share({"fraction": "auto"})).spec
    assert spec is not None and spec.auto
    inherited = inherited_annotations(spec, share_name="train")
    assert ANN_FRACTION not in inherited and inherited[ANN_SHARE] == "train"
