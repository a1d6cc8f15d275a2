"""Pods a GpuShare's selector matches but the share does not govern are reported on the share
and on the pod, saying what to do (gpushare.cluster.operator.unlinked): none is silently left
without the share's GPU, and each is reported once per share generation."""

import asyncio
from typing import Any

from gpushare.api.names import ANN_SHARE
from gpushare.cluster.operator.unlinked import (
    REASON_NOT_ENABLED,
    REASON_NOT_LINKED,
    REASON_OVERLAP,
    UnlinkedReporter,
    unlinked_pods,
)
from gpushare.cluster.state.shares import share_summary
from gpushare.kube.events import ObjectRef

SHARE = share_summary(
    {
        "metadata": {"name": "trainer", "namespace": "ml", "uid": "u-1", "generation": 1},
        "spec": {"fraction": "0.25", "selector": {"matchLabels": {"app": "trainer"}}},
        "status": {"phase": "Pending"},
    }
)


def pod(name: str, *, labels: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    ann = extra.pop("annotations", {})
    return {
        "metadata": {
            "name": name,
            "namespace": extra.pop("namespace", "ml"),
            "uid": f"uid-{name}",
            "labels": {"app": "trainer"} if labels is None else labels,
            "annotations": ann,
            **extra,
        },
        "status": {"phase": extra.pop("phase", "Running")},
    }


def test_each_matching_pod_the_share_does_not_govern_is_named_with_its_reason() -> None:
    pods = [
        pod("early"),
        pod("linked", annotations={ANN_SHARE: "trainer"}),
        pod("theirs", annotations={ANN_SHARE: "infer"}),
        pod("web", labels={"app": "web"}),
        pod("leaving", deletionTimestamp="2026-01-01T00:00:00Z"),
        pod("elsewhere", namespace="other"),
    ]
    found = unlinked_pods(SHARE, pods, enabled=True)
    assert [(u.pod, u.reason) for u in found] == [
        ("early", REASON_NOT_LINKED),
        ("theirs", REASON_OVERLAP),
    ]
    early, theirs = found
    assert "Delete the pod so that its controller makes it again" in early.message
    assert "GpuShare infer" in theirs.message and "GpuShare trainer" in theirs.message
    (unconsented,) = unlinked_pods(SHARE, [pod("early")], enabled=False)
    assert unconsented.reason == REASON_NOT_ENABLED
    assert "gpushare.io/share-selectors=enabled" in unconsented.message
    assert "gpushare.io/share: trainer" in unconsented.message


class Kube:
    """The two reads and the Event post the reporter makes, recorded."""

    def __init__(self, pods: list[dict[str, Any]], labels: dict[str, str]) -> None:
        self.pods, self.labels = pods, labels
        self.listed: list[dict[str, str]] = []
        self.events: list[tuple[str, str, str]] = []

    async def namespace_labels(self, name: str) -> dict[str, str]:
        return self.labels

    async def list_labelled_pods(self, *, namespace: str, labels: dict[str, str]) -> list[Any]:
        self.listed.append(dict(labels))
        return self.pods

    async def post_event(
        self, *, about: ObjectRef, reason: str, message: str, warning: bool = False
    ) -> None:
        assert warning
        self.events.append((about.kind, about.name, reason))


def test_reported_on_the_share_and_the_pod_once_per_generation() -> None:
    kube = Kube([pod("early")], {"gpushare.io/share-selectors": "enabled"})
    reporter = UnlinkedReporter(kube)  # type: ignore[arg-type]
    assert [u.pod for u in asyncio.run(reporter.check(SHARE))] == ["early"]
    assert kube.listed == [{"app": "trainer"}]  # the server filters by the selector's labels
    assert kube.events == [
        ("GpuShare", "trainer", REASON_NOT_LINKED),
        ("Pod", "early", REASON_NOT_LINKED),
    ]
    assert asyncio.run(reporter.check(SHARE)) == []  # the same generation: once
    changed = share_summary({**SHARE.body, "metadata": {**SHARE.body["metadata"], "generation": 2}})
    assert [u.pod for u in asyncio.run(reporter.check(changed))] == ["early"]


def test_a_share_not_yet_accepted_is_not_looked_at() -> None:
    kube = Kube([pod("early")], {"gpushare.io/share-selectors": "enabled"})
    fresh = share_summary({**SHARE.body, "status": {}})
    assert asyncio.run(UnlinkedReporter(kube).check(fresh)) == []  # type: ignore[arg-type]
    assert kube.listed == [] and kube.events == []
