"""The demands gpushare.cluster.state.gpu_requests.demand_of keeps by the pod's inputs against
read_demand, which reads the pod afresh (issue 47: kept answers never differ from the
reference): the same demand for every pod of a varied stream, asked twice; bad input refused
every time with the reason; inputs too long or not plain JSON read afresh."""

import random
from typing import Any

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import (
    ANN_AVOID_GPUS,
    ANN_CLASS,
    ANN_FRACTION,
    ANN_MEMORY,
    ANN_OPPORTUNISTIC,
    RESOURCE_GPU_OPPORTUNISTIC,
    RESOURCE_GPU_PERCENT,
)
from gpushare.cluster.state import gpu_requests
from gpushare.cluster.state.gpu_requests import demand_of, read_demand


def _pod(rng: random.Random, i: int) -> dict[str, Any]:
    ann: dict[str, str] = {}
    if rng.random() < 0.8:
        ann[ANN_FRACTION] = rng.choice(("0.05", "0.25", "50%", "1", "2", "0.81"))
    if rng.random() < 0.3:
        ann[ANN_CLASS] = rng.choice(("latency", "batch"))
    if rng.random() < 0.2:
        ann[ANN_MEMORY] = rng.choice(("4Gi", "20Gi", "512Mi"))
    if rng.random() < 0.1:
        ann[ANN_AVOID_GPUS] = "GPU-a,GPU-b"
    if rng.random() < 0.1:
        ann[ANN_OPPORTUNISTIC] = "true"
    if rng.random() < 0.3:
        ann["gpushare.io/bind-time"] = f"2026-11-25T00:00:{i % 60:02d}Z"
    resource = rng.choice((RESOURCE_GPU_PERCENT, RESOURCE_GPU_OPPORTUNISTIC, None))
    requests = {"cpu": rng.choice(("500m", "2", "8000m")), "memory": rng.choice(("1Gi", "300Mi"))}
    limits: dict[str, str] = {}
    if resource is not None:
        limits[resource] = rng.choice(("25", "50", "100", "81"))
    containers = [{"name": "c", "resources": {"requests": requests, "limits": limits}}]
    if rng.random() < 0.2:
        containers.append({"name": "side", "resources": {"requests": {"cpu": "100m"}}})
    spec: dict[str, Any] = {"containers": containers}
    if rng.random() < 0.1:
        spec["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "16"}}}]
    if rng.random() < 0.1:
        spec["overhead"] = {"cpu": "250m"}
    namespace = rng.choice(("a", "b", None))
    return {"metadata": {"name": f"p{i}", "namespace": namespace, "annotations": ann}, "spec": spec}


def _outcome(read: Any, pod: dict[str, Any]) -> object:
    try:
        return read(pod)
    except InvalidInputError as exc:
        return ("refused", str(exc))


def test_kept_demands_are_the_ones_read_afresh_for_every_pod() -> None:
    rng = random.Random(4711)
    pods = [_pod(rng, i) for i in range(3000)]
    refused = 0
    for _ in range(2):  # the second round answers from what was kept
        for pod in pods:
            kept = _outcome(demand_of, pod)
            assert kept == _outcome(read_demand, pod), pod
            refused += isinstance(kept, tuple)
    assert 0 < refused < len(pods)  # some inputs are bad, and are refused every time


def test_long_or_unusual_inputs_are_read_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_requests, "_demands", {})
    pod = _pod(random.Random(1), 0)
    pod["metadata"]["annotations"] = {ANN_FRACTION: "0.25"}
    pod["spec"]["overhead"] = {"example.com/thing": "x" * 10_000}
    assert demand_of(pod) == read_demand(pod) and not gpu_requests._demands
    pod["spec"]["overhead"] = {"cpu": object()}  # not JSON: nothing kept
    assert demand_of(pod) == read_demand(pod) and not gpu_requests._demands
    # Annotations it does not read (a bind's placement, a long note) do not matter.
    del pod["spec"]["overhead"]
    first = demand_of(pod)
    pod["metadata"]["annotations"] |= {"note": "x" * 10_000, "gpushare.io/state": "assumed"}
    assert demand_of(pod) is first and len(gpu_requests._demands) == 1


class _Recording(dict[str, str]):
    """Annotations that remember which keys were read."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)

    def __iter__(self) -> Any:
        self.read.update(self.keys())
        return super().__iter__()

    def items(self) -> Any:
        self.read.update(self.keys())
        return super().items()

    def values(self) -> Any:
        self.read.update(self.keys())
        return super().values()


def test_the_demand_reads_only_the_annotations_it_is_kept_by() -> None:
    rng = random.Random(12)
    read: set[str] = set()
    for i in range(2000):
        pod = _pod(rng, i)
        ann = _Recording(pod["metadata"]["annotations"])
        _outcome(lambda p, a=ann: read_demand(p, ann=a), pod)
        read |= ann.read
    assert read == set(gpu_requests.DEMAND_ANNOTATIONS)
