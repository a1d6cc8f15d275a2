"""The claim templates of annotated pods in DRA mode are made by the controller for pods the API
server stored, never on an admission review (issue #45: forged reviews made a template per
request in any namespace, without bound), at most a bound per namespace, and deleted once no
pod has referred to them for a while. The real cluster: tests/cluster/dra/test_dra_security.py.
"""

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import pytest

from gpushare.api.dra import POD_CLAIM
from gpushare.api.names import ANN_FRACTION, SLICES_PER_GPU
from gpushare.api.request import GpuRequest
from gpushare.cluster.dra.templates import (
    CONFLICT_REASON,
    OVER_BOUND_REASON,
    ClaimTemplates,
    TemplateKeeper,
    request_of_template,
)
from gpushare.cluster.webhook import claims

CLASS = "mps.gpushare.io"


class Api:
    """The API server's templates (it adds defaults to what it stores) and Events."""

    def __init__(self, templates: ClaimTemplates) -> None:
        self.templates = templates
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.creates: list[str] = []
        self.deletes: list[str] = []
        self.events: list[tuple[str, str, str]] = []

    async def create_claim_template(self, body: Mapping[str, Any]) -> bool:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        self.creates.append("/".join(key))
        if key in self.objects:
            return False
        stored: dict[str, Any] = json.loads(json.dumps(body))
        stored["metadata"]["uid"] = f"uid-{len(self.creates)}"
        for r in stored["spec"]["spec"]["devices"]["requests"]:
            r["exactly"].setdefault("allocationMode", "ExactCount")
        self.objects[key] = stored
        self.templates.upsert(stored)  # the watch
        return True

    async def get_claim_template(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((namespace, name))

    async def delete_claim_template(self, *, namespace: str, name: str) -> None:
        self.deletes.append(f"{namespace}/{name}")
        gone = self.objects.pop((namespace, name), None)
        if gone is not None:
            self.templates.delete(gone)

    async def pod_event(
        self, *, pod: Mapping[str, Any], reason: str, message: str, warning: bool
    ) -> None:
        self.events.append((pod["metadata"]["name"], reason, message))


def stored_pod(
    name: str,
    template: str,
    *,
    namespace: str = "team",
    claimed: bool = False,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod as the pod watch shows it after the webhook pointed it at ``template``."""
    pod: dict[str, Any] = {
        "metadata": {
            "namespace": namespace,
            "name": name,
            "annotations": {ANN_FRACTION: "0.25"} if annotations is None else annotations,
        },
        "spec": {"resourceClaims": [{"name": POD_CLAIM, "resourceClaimTemplateName": template}]},
        "status": {"phase": "Pending"},
    }
    if claimed:
        pod["status"]["resourceClaimStatuses"] = [
            {"name": POD_CLAIM, "resourceClaimName": f"{name}-{POD_CLAIM}-x"}
        ]
    return pod


def keeper(*, bound: int = 32, idle_s: float = 600.0) -> tuple[TemplateKeeper, Api, list[float]]:
    now = [0.0]
    templates = ClaimTemplates(device_class=CLASS)
    templates.replace([])
    api = Api(templates)
    k = TemplateKeeper(
        templates=templates, api=api, per_namespace=bound, idle_s=idle_s, clock=lambda: now[0]
    )
    return k, api, now


@pytest.mark.parametrize(
    "request_",
    [
        GpuRequest(percent=25, memory_bytes=None),
        GpuRequest(percent=30, memory_bytes=4 * 2**30, gpu_class="latency", limit_percent=45),
        GpuRequest(percent=1, memory_bytes=1536 * 2**20),
        GpuRequest(percent=99, memory_bytes=123_457, limit_percent=100),
        GpuRequest(percent=100, memory_bytes=None, gpu_class="latency"),
        GpuRequest(percent=800, memory_bytes=None),
    ],
)
def test_a_template_name_stands_for_exactly_the_template_the_webhook_asked_for(
    request_: GpuRequest,
) -> None:
    name = claims.template_name(request_)
    assert request_of_template(name) == request_
    wanted = ClaimTemplates(device_class=CLASS).wanted("team", name)
    assert wanted == claims.claim_template(request_, namespace="team", device_class=CLASS)


@pytest.mark.parametrize(
    "name",
    [
        "gpushare-0pct",
        "gpushare-050pct",
        "gpushare-150pct",
        "gpushare-6500pct",
        "gpushare-25pct-limit20",
        "gpushare-25pct-limit101",
        "gpushare-25pct-4Gi",
        "gpushare-25pct-batch",
        "gpushare-100pct-4gi",
        "gpushare-25pct-1073741824",  # 1Gi, which gpushare names 1gi
        "gpushare-25pct-99999999999999999999gi",
        "gpushare-25pct-\x1b[2J",
        "gpushare-" + "9" * 5000 + "pct",
        "my-template",
    ],
)
def test_any_other_name_stands_for_nothing(name: str) -> None:
    assert request_of_template(name) is None
    assert ClaimTemplates(device_class=CLASS).wanted("team", name) is None


def test_a_stored_pod_gets_its_template_once_and_the_next_pod_reuses_it() -> None:
    k, api, _ = keeper()
    k.pod_event(stored_pod("a", "gpushare-25pct"))
    k.pod_event(stored_pod("b", "gpushare-25pct"))
    asyncio.run(k.round())
    asyncio.run(k.round())
    assert api.creates == ["team/gpushare-25pct"]
    made = api.objects[("team", "gpushare-25pct")]
    assert made["metadata"]["labels"] == claims.MANAGED_BY
    assert k.templates.ours_in("team") == 1


@pytest.mark.parametrize(
    "pod",
    [
        stored_pod("plain", "gpushare-25pct", annotations={}),  # no gpushare request
        stored_pod("mine", "my-own-template"),
        stored_pod("odd", "gpushare-25pct-4Gi"),  # not a name gpushare gives
        stored_pod("done", "gpushare-25pct", claimed=True),  # its claim exists
    ],
)
def test_pods_that_need_no_template_of_gpushares_get_none(pod: dict[str, Any]) -> None:
    k, api, _ = keeper()
    k.pod_event(pod)
    asyncio.run(k.round())
    assert api.creates == [] and api.events == []


def test_a_namespace_at_its_bound_gets_no_more_and_the_pod_is_told_why() -> None:
    k, api, _ = keeper(bound=2)
    for n, template in enumerate(("gpushare-10pct", "gpushare-20pct", "gpushare-30pct")):
        k.pod_event(stored_pod(f"p{n}", template))
    k.pod_event(stored_pod("elsewhere", "gpushare-30pct", namespace="other"))
    asyncio.run(k.round())
    asyncio.run(k.round())
    assert sorted(api.creates) == [
        "other/gpushare-30pct",
        "team/gpushare-10pct",
        "team/gpushare-20pct",
    ]
    ((pod, reason, message),) = api.events  # said once
    assert (pod, reason) == ("p2", OVER_BOUND_REASON)
    assert "ResourceClaimTemplate team/gpushare-30pct" in message
    assert "--dra-templates-per-namespace" in message and "dra.templatesPerNamespace" in message


def test_a_template_of_that_name_with_another_spec_is_never_used_or_overwritten() -> None:
    k, api, _ = keeper()
    forged = claims.claim_template(
        GpuRequest(percent=SLICES_PER_GPU, memory_bytes=None), namespace="team", device_class=CLASS
    )
    forged["metadata"]["name"] = "gpushare-25pct"
    api.objects[("team", "gpushare-25pct")] = forged
    k.templates.upsert(forged)
    k.pod_event(stored_pod("a", "gpushare-25pct"))
    asyncio.run(k.round())
    assert api.creates == [] and api.objects[("team", "gpushare-25pct")] == forged
    ((_, reason, message),) = api.events
    assert reason == CONFLICT_REASON and "kubectl delete resourceclaimtemplate" in message
    assert k.templates.ours_in("team") == 0  # not gpushare's: never counted, never deleted


def test_an_unused_template_is_deleted_after_the_idle_time_and_made_again_on_demand() -> None:
    k, api, now = keeper(idle_s=600)
    k.pod_event(stored_pod("a", "gpushare-25pct"))
    asyncio.run(k.round())
    k.pod_event(stored_pod("a", "gpushare-25pct", claimed=True))  # the claim was made
    now[0] = 700
    asyncio.run(k.round())
    assert api.deletes == []  # a running pod still refers to it
    k.pod_gone("team/a")
    now[0] = 1000
    asyncio.run(k.round())
    assert api.deletes == []
    now[0] = 1301
    asyncio.run(k.round())
    assert api.deletes == ["team/gpushare-25pct"] and k.templates.ours_in("team") == 0
    k.pod_event(stored_pod("b", "gpushare-25pct"))
    asyncio.run(k.round())
    assert api.creates == ["team/gpushare-25pct", "team/gpushare-25pct"]


def test_templates_gpushare_did_not_make_are_never_deleted() -> None:
    k, api, now = keeper(idle_s=1)
    theirs = claims.claim_template(
        GpuRequest(percent=25, memory_bytes=None), namespace="team", device_class=CLASS
    )
    theirs["metadata"]["labels"] = {"app": "mine"}
    k.templates.replace([theirs])
    now[0] = 10
    asyncio.run(k.round())
    asyncio.run(k.round())
    assert api.deletes == []


def test_a_template_deleted_behind_the_watchs_back_is_made_again_for_a_waiting_pod() -> None:
    k, api, now = keeper()
    k.pod_event(stored_pod("a", "gpushare-25pct"))
    asyncio.run(k.round())
    del api.objects[("team", "gpushare-25pct")]  # deleted, the watch not told yet
    now[0] = 11
    asyncio.run(k.round())
    assert api.creates == ["team/gpushare-25pct", "team/gpushare-25pct"]


def test_a_full_list_forgets_pods_gone_meanwhile() -> None:
    k, _, _ = keeper()
    k.pod_event(stored_pod("a", "gpushare-25pct"))
    k.pods_listed([stored_pod("b", "gpushare-30pct")])
    assert k.users("team", "gpushare-25pct") == 0 and k.users("team", "gpushare-30pct") == 1
