"""The pause loop's decisions, pass by pass (gpushare.node.pausing): a request freezes a pod
gpushare placed and is recorded and announced; its withdrawal thaws it; a new agent resolves
what an old one left; a malformed request or a pod gpushare did not place is never frozen; a
failed thaw is retried and reported. The cgroups are a cgroup v1 freezer tree laid out as the
kubelet lays it out (the kernel itself: tests/cluster/test_pause_cluster.py)."""

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpushare.api.names import ANN_BIND_TIME, ANN_GPU_UUID, ANN_PAUSE, ANN_PAUSED
from gpushare.api.pause import PauseRequest, PauseState, load_pause_state
from gpushare.api.pod import PodInfo, pod_info
from gpushare.node.pausing.decisions import FreezeState, Step, Wanted, next_step
from gpushare.node.pausing.freezer import Freezer
from gpushare.node.pausing.metrics import PauseCollector
from gpushare.node.pausing.pauser import Pauser

UID = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"
APP = "a" * 64
SANDBOX = "c" * 64
REQUEST = PauseRequest(
    reason="guaranteed-needs-room", message="default/infer needs GPU 0's compute", since="t1"
)


class Kube:
    """The API server as the pause loop sees it: the pod's annotations and its Events."""

    def __init__(self, manifest: dict[str, Any]) -> None:
        self.manifest = manifest
        self.events: list[tuple[str, str, bool]] = []
        self.fail_writes = False

    def set_pod_annotation(self, *, pod: PodInfo, key: str, value: str | None) -> None:
        if self.fail_writes:
            raise RuntimeError("the API server is away")
        annotations = self.manifest["metadata"].setdefault("annotations", {})
        if value is None:
            annotations.pop(key, None)
        else:
            annotations[key] = value

    def record_event(
        self, *, pod: PodInfo | None, reason: str, message: str, warning: bool
    ) -> None:
        self.events.append((reason, message, warning))

    def pods(self) -> list[PodInfo]:
        return [pod_info(json.loads(json.dumps(self.manifest)))]

    def ask(self, request: PauseRequest | str | None) -> None:
        annotations = self.manifest["metadata"].setdefault("annotations", {})
        if request is None:
            annotations.pop(ANN_PAUSE, None)
        else:
            annotations[ANN_PAUSE] = request if isinstance(request, str) else request.dump()

    def reasons(self) -> list[str]:
        return [r for r, _, _ in self.events]


def manifest(*, placed: bool = True) -> dict[str, Any]:
    annotations = {ANN_GPU_UUID: "GPU-1", ANN_BIND_TIME: "2026-11-27T10:00:00Z"} if placed else {}
    return {
        "metadata": {"name": "train", "namespace": "ml", "uid": UID, "annotations": annotations},
        "spec": {"containers": [{"name": "main"}]},
        "status": {
            "phase": "Running",
            "qosClass": "BestEffort",
            "containerStatuses": [{"name": "main", "containerID": f"containerd://{APP}"}],
        },
    }


@pytest.fixture
def cgroups(tmp_path: Path) -> Path:
    (tmp_path / "freezer").mkdir()
    (tmp_path / "freezer" / "cgroup.procs").write_text("")
    for cid in (APP, SANDBOX):
        d = tmp_path / "freezer" / "kubepods" / "besteffort" / f"pod{UID}" / cid
        d.mkdir(parents=True)
        (d / "freezer.state").write_text("THAWED\n")
    return tmp_path


def state(root: Path, cid: str = APP) -> str:
    path = root / "freezer" / "kubepods" / "besteffort" / f"pod{UID}" / cid / "freezer.state"
    return path.read_text().strip()


def pauser(root: Path, kube: Kube, now: list[float]) -> Pauser:
    return Pauser(
        freezer=Freezer(root, settle_s=0.1),
        kube=kube,
        placed=lambda p: p.placement is not None,
        clock=lambda: now[0],
    )


def samples(p: Pauser) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(PauseCollector(node_name="n1", stats=p.stats, clock=p.clock))
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "node"))): s.value
        for m in registry.collect()
        for s in m.samples
    }


def test_a_request_freezes_the_pod_records_it_and_its_withdrawal_resumes_it(cgroups: Path) -> None:
    kube, now = Kube(manifest()), [1000.0]
    p = pauser(cgroups, kube, now)
    p.reconcile(kube.pods())
    assert state(cgroups) == "THAWED" and kube.events == []

    kube.ask(REQUEST)
    p.reconcile(kube.pods())
    assert state(cgroups) == "FROZEN"
    assert state(cgroups, SANDBOX) == "THAWED"  # the sandbox is not the pod's container
    record = load_pause_state(kube.manifest["metadata"]["annotations"][ANN_PAUSED])
    assert record.request_since == "t1" and record.since == "1970-01-01T00:16:40Z"
    assert kube.reasons() == ["Paused"]
    assert "default/infer needs GPU 0's compute" in kube.events[0][1]
    assert samples(p)[("gpushare_pods_paused", ())] == 1

    now[0] += 30
    p.reconcile(kube.pods())  # nothing changed: nothing done, nothing said again
    assert kube.reasons() == ["Paused"]

    kube.ask(None)
    p.reconcile(kube.pods())
    assert state(cgroups) == "THAWED"
    assert ANN_PAUSED not in kube.manifest["metadata"]["annotations"]
    assert kube.reasons() == ["Paused", "Resumed"]
    assert "after 30 s paused" in kube.events[1][1] and "withdrew" in kube.events[1][1]
    got = samples(p)
    assert got[("gpushare_pod_pauses_total", (("reason", "guaranteed-needs-room"),))] == 1
    assert got[("gpushare_pod_resumes_total", (("reason", "withdrawn"),))] == 1
    assert got[("gpushare_pod_paused_seconds_total", ())] == 30
    assert got[("gpushare_pods_paused", ())] == 0


def test_a_new_agent_thaws_a_pod_whose_request_went_while_no_agent_ran(cgroups: Path) -> None:
    kube, now = Kube(manifest()), [1000.0]
    kube.ask(REQUEST)
    pauser(cgroups, kube, now).reconcile(kube.pods())
    assert state(cgroups) == "FROZEN"
    # The agent dies; the controller withdraws the request meanwhile.
    kube.ask(None)
    kube.events.clear()
    now[0] += 60
    pauser(cgroups, kube, now).reconcile(kube.pods())
    assert state(cgroups) == "THAWED"
    assert ANN_PAUSED not in kube.manifest["metadata"]["annotations"]
    assert kube.reasons() == ["Resumed"]
    assert "after 60 s paused" in kube.events[0][1]


def test_a_new_agent_keeps_a_pod_paused_whose_request_stands_and_says_nothing(
    cgroups: Path,
) -> None:
    kube, now = Kube(manifest()), [1000.0]
    kube.ask(REQUEST)
    pauser(cgroups, kube, now).reconcile(kube.pods())
    kube.events.clear()
    now[0] += 60
    again = pauser(cgroups, kube, now)
    again.reconcile(kube.pods())
    assert state(cgroups) == "FROZEN" and kube.events == []
    now[0] += 5
    # Its paused time counts from the new agent's start, not from the freeze (a counter that
    # restarts at 0 with the process).
    assert samples(again)[("gpushare_pod_paused_seconds_total", ())] == 5
    assert samples(again)[("gpushare_pods_paused", ())] == 1


def test_an_agent_that_froze_but_died_before_recording_is_recorded_by_the_next(
    cgroups: Path,
) -> None:
    kube, now = Kube(manifest()), [1000.0]
    kube.ask(REQUEST)
    kube.fail_writes = True
    pauser(cgroups, kube, now).reconcile(kube.pods())
    assert state(cgroups) == "FROZEN" and ANN_PAUSED not in kube.manifest["metadata"]["annotations"]
    kube.fail_writes = False
    pauser(cgroups, kube, now).reconcile(kube.pods())
    assert ANN_PAUSED in kube.manifest["metadata"]["annotations"]


@pytest.mark.parametrize(
    "text", ['{"reason": "whim", "message": "", "since": "t"}', "not json", '{"reason": 1}']
)
def test_a_malformed_request_never_freezes_and_is_reported_once(cgroups: Path, text: str) -> None:
    kube, now = Kube(manifest()), [1000.0]
    kube.ask(text)
    p = pauser(cgroups, kube, now)
    p.reconcile(kube.pods())
    p.reconcile(kube.pods())
    assert state(cgroups) == "THAWED"
    assert kube.reasons() == ["PauseFailed"]
    _, message, warning = kube.events[0]
    assert warning and ANN_PAUSE in message and "keeps running" in message
    assert (
        samples(p)[
            ("gpushare_pod_pause_failures_total", (("operation", "pause"), ("reason", "malformed")))
        ]
        == 1
    )


def test_a_request_spoiled_while_paused_resumes_the_pod(cgroups: Path) -> None:
    kube, now = Kube(manifest()), [1000.0]
    p = pauser(cgroups, kube, now)
    kube.ask(REQUEST)
    p.reconcile(kube.pods())
    kube.ask("{}")
    p.reconcile(kube.pods())
    assert state(cgroups) == "THAWED"
    assert kube.reasons() == ["Paused", "PauseFailed", "Resumed"]
    assert samples(p)[("gpushare_pod_resumes_total", (("reason", "malformed"),))] == 1


def test_a_pod_gpushare_did_not_place_is_never_frozen(cgroups: Path) -> None:
    kube, now = Kube(manifest(placed=False)), [1000.0]
    kube.ask(REQUEST)
    pauser(cgroups, kube, now).reconcile(kube.pods())
    assert state(cgroups) == "THAWED"
    assert ANN_PAUSED not in kube.manifest["metadata"]["annotations"]
    assert kube.reasons() == ["PauseFailed"]
    assert "not placed on this node by gpushare" in kube.events[0][1]


def test_a_paused_pod_being_deleted_is_thawed_so_that_it_can_stop(cgroups: Path) -> None:
    kube, now = Kube(manifest()), [1000.0]
    p = pauser(cgroups, kube, now)
    kube.ask(REQUEST)
    p.reconcile(kube.pods())
    kube.manifest["metadata"]["deletionTimestamp"] = "2026-11-27T10:05:00Z"
    p.reconcile(kube.pods())
    assert state(cgroups) == "THAWED"
    assert "being deleted" in kube.events[-1][1]


def test_a_container_started_while_paused_is_frozen_too(cgroups: Path) -> None:
    kube, now = Kube(manifest()), [1000.0]
    p = pauser(cgroups, kube, now)
    kube.ask(REQUEST)
    p.reconcile(kube.pods())
    new = "d" * 64
    d = cgroups / "freezer" / "kubepods" / "besteffort" / f"pod{UID}" / new
    d.mkdir()
    (d / "freezer.state").write_text("THAWED\n")
    kube.manifest["status"]["containerStatuses"][0]["containerID"] = f"containerd://{new}"
    p.reconcile(kube.pods())
    assert state(cgroups, new) == "FROZEN"
    assert kube.reasons() == ["Paused"]  # still the one pause
    assert samples(p)[("gpushare_pod_pauses_total", (("reason", "guaranteed-needs-room"),))] == 1


def test_a_failed_thaw_is_reported_and_retried_on_the_next_pass(tmp_path: Path) -> None:
    """cgroup v2: a thaw is in effect when cgroup.events says ``frozen 0``; here the kernel
    (a file) keeps saying ``frozen 1`` until the test lets it go."""
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    cgroup = tmp_path / "kubepods" / "besteffort" / f"pod{UID}" / APP
    cgroup.mkdir(parents=True)
    (cgroup / "cgroup.freeze").write_text("1\n")
    (cgroup / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    kube, now = Kube(manifest()), [1000.0]
    p = pauser(tmp_path, kube, now)
    kube.ask(REQUEST)
    p.reconcile(kube.pods())
    assert kube.reasons() == ["Paused"]
    kube.ask(None)
    p.reconcile(kube.pods())
    p.reconcile(kube.pods())  # tried again, reported once
    assert kube.reasons() == ["Paused", "ResumeFailed"]
    assert kube.events[-1][2] and "tries again" in kube.events[-1][1]
    assert (cgroup / "cgroup.freeze").read_text() == "0"
    assert (
        samples(p)[
            (
                "gpushare_pod_pause_failures_total",
                (("operation", "resume"), ("reason", "not-settled")),
            )
        ]
        == 2
    )
    (cgroup / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    p.reconcile(kube.pods())
    assert kube.reasons()[-1] == "Resumed"
    assert ANN_PAUSED not in kube.manifest["metadata"]["annotations"]


@pytest.mark.parametrize(
    ("frozen", "actual", "record", "has", "step"),
    [
        (True, FreezeState.NONE, None, False, Step.WAIT),
        (True, FreezeState.THAWED, None, False, Step.FREEZE),
        (True, FreezeState.PARTLY, "t1", True, Step.FREEZE),
        (True, FreezeState.FROZEN, None, False, Step.RECORD),
        (True, FreezeState.FROZEN, "t0", True, Step.RECORD),  # a newer request
        (True, FreezeState.FROZEN, "t1", True, Step.NOTHING),
        (False, FreezeState.FROZEN, None, False, Step.THAW),
        (False, FreezeState.PARTLY, None, False, Step.THAW),
        (False, FreezeState.THAWED, "t1", True, Step.CLEAR),
        (False, FreezeState.NONE, None, True, Step.CLEAR),
        (False, FreezeState.THAWED, None, False, Step.NOTHING),
    ],
)
def test_next_step(
    frozen: bool, actual: FreezeState, record: str | None, has: bool, step: Step
) -> None:
    want = Wanted(frozen, REQUEST if frozen else None, "r")
    recorded = PauseState(since="s", request_since=record) if record else None
    assert next_step(want, actual, recorded, has_record=has) is step
