"""The operator writes a GpuShare's profile on its running pods once it is measured. What fits
beside such a pod follows (a bound pod's request stays as placed, its profile does not), and
kube-scheduler sees no event it acts on (an annotation of a bound pod): the view counts the
change so the controller asks the scheduler to retry the pods refused meanwhile
(docs/scheduling.md, "Scheduler extender"). Under load the profile often came after the bind:
an opted-in pod was refused beside tenants read as saturating, and never retried."""

import json
from datetime import UTC, datetime
from typing import Any

from gpushare.api.gpushare_crd import ANN_PROFILE, profile_annotation
from gpushare.api.names import (
    ANN_OPPORTUNISTIC,
    ANN_SHARE,
    RESOURCE_GPU_OPPORTUNISTIC,
    STATE_ALLOCATED,
)
from gpushare.api.placement import Placement
from gpushare.api.profile import GpuProfile
from gpushare.cluster.extender.args import parse_extender_args
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.state.view import ClusterView
from gpushare.packing.admission import Admission
from gpushare.packing.opportunistic import Opportunism
from gpushare.packing.policy import Policy
from tests.fixtures.builders import GIB, gpu, node_json, pod_json

NOW = datetime(2026, 11, 26, tzinfo=UTC)
STATUS_PROFILE = (
    GpuProfile.from_counters(
        {"fp16": 0.06, "fp32": 0.27, "fp64": 0.01, "tensor": 0.33, "sm_occupancy": 0.36,
         "dram_bandwidth": 0.0, "sm_utilization": 0.4},
        gpu_model="NVIDIA H100 80GB HBM3",
    )
    .stored(now=NOW)
    .to_status()
)  # fmt: skip
PROFILE = profile_annotation(STATUS_PROFILE)
SHARE = {
    "metadata": {"name": "train", "namespace": "ml", "uid": "u-1"},
    "spec": {"fraction": "0.6"},
    "status": {"phase": "Packed", "profile": STATUS_PROFILE},
}


def tenant(name: str, uuid: str, *, profiled: bool) -> dict[str, Any]:
    """A 60% pod of GpuShare ``train`` running uncapped (100% threads), as a share's first,
    profiled pod runs."""
    ann = {ANN_SHARE: "train", **({ANN_PROFILE: PROFILE} if profiled else {})}
    placed = Placement((uuid,), 100, 16 * GIB, NOW, STATE_ALLOCATED, request_percent=60)
    return pod_json(
        name, namespace="ml", annotations=ann, fraction="0.6", node="n", placement=placed,
        phase="Running", scheduled=True,
    )  # fmt: skip


def opted_in() -> dict[str, Any]:
    return pod_json(
        "train-2",
        namespace="ml",
        annotations={ANN_SHARE: "train", ANN_PROFILE: PROFILE, ANN_OPPORTUNISTIC: "true"},
        fraction="0.6",
        scheduled=True,
        containers=[
            {"name": "main", "image": "busybox",
             "resources": {"limits": {RESOURCE_GPU_OPPORTUNISTIC: "60"}}},
        ],
    )  # fmt: skip


def filter_once(extender: Extender) -> tuple[list[str], str]:
    args = parse_extender_args({"Pod": opted_in(), "NodeNames": ["n"]})
    result = extender.filter(args)
    refused = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}
    return list(result["NodeNames"]), refused.get("n", "")


def test_a_pod_refused_beside_unprofiled_tenants_fits_and_is_retried_once_profiled() -> None:
    view = ClusterView()
    view.upsert_share(json.loads(json.dumps(SHARE)))
    view.replace_nodes([node_json("n", [gpu("G0", index=0), gpu("G1", index=1)])])
    view.replace_pods(
        [tenant("train-0", "G0", profiled=False), tenant("train-1", "G1", profiled=False)]
    )
    extender = Extender(
        view=view,
        writer=None,
        policy=Policy.BINPACK,
        admission=Admission(),
        opportunism=Opportunism(),
    )
    names, why = filter_once(extender)
    # Beside tenants of unknown profile, read as saturating, it would add nothing.
    assert names == [] and "predicted gain" in why, why
    before = view.placed_rules_changed

    view.upsert_pod(tenant("train-0", "G0", profiled=True))
    view.upsert_pod(tenant("train-1", "G1", profiled=True))
    assert view.placed_rules_changed == before + 2
    names, why = filter_once(extender)
    assert names == ["n"], why
    # Nothing of the rules changed: no retry is asked for.
    view.upsert_pod(tenant("train-1", "G1", profiled=True))
    assert view.placed_rules_changed == before + 2


def test_a_pending_pods_own_rules_are_no_reason_to_retry_others() -> None:
    view = ClusterView()
    view.replace_nodes([node_json("n", [gpu("G0")])])
    view.replace_pods([])
    view.upsert_pod(opted_in() | {"metadata": opted_in()["metadata"] | {"annotations": {}}})
    view.upsert_pod(opted_in())
    assert view.placed_rules_changed == 0
