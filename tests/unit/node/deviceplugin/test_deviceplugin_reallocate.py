"""A kubelet killed between our Allocate answer and its checkpoint asks again for the same pod
after it restarts. The pod must get its own placement again, and the pods after it theirs."""

import json
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpushare.api.inventory import GpuInfo
from gpushare.api.names import (
    ANN_BIND_TIME,
    ANN_GPU_UUID,
    ANN_MEMORY_LIMIT,
    ANN_STATE,
    ANN_THREAD_PERCENT,
    STATE_ALLOCATED,
    STATE_ASSUMED,
)
from gpushare.api.pod import PodInfo, pod_info
from gpushare.node.core.answer import AllocationError
from gpushare.node.deviceplugin.allocator import Allocator
from gpushare.node.deviceplugin.devices import device_id, slice_ids
from gpushare.node.deviceplugin.holdings import Answer, AnswerBook
from gpushare.node.deviceplugin.matching import select_pod
from gpushare.node.deviceplugin.reconcile import forgotten_pods, reconcile, suspect_pods
from gpushare.node.deviceplugin.steering import steer
from gpushare.node.mps.manager import MpsManager

GIB = 2**30
GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
GPU_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
OLD, NEW = "11:100", "12:200"  # kubelet identities before and after the restart


def pod(
    name: str,
    gpus: str = GPU_A,
    *,
    bind_s: int = 0,
    threads: int = 10,
    memory_gib: int | None = None,
    state: str = "assumed",
    phase: str = "Pending",
    started: bool = False,
) -> PodInfo:
    return PodInfo(
        namespace="team",
        name=name,
        uid=f"uid-{name}",
        annotations={
            ANN_GPU_UUID: gpus,
            ANN_THREAD_PERCENT: str(threads),
            ANN_MEMORY_LIMIT: str((memory_gib or threads) * GIB),
            ANN_BIND_TIME: (T0 + timedelta(seconds=bind_s)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            ANN_STATE: state,
        },
        phase=phase,
        requested_slices=(threads,),
        created=T0,
        started=started,
    )


def answer(p: PodInfo, kubelet: str, devices: tuple[str, ...] = ()) -> Answer:
    return Answer(p.uid, p.key, devices, kubelet, 0.0)


# --- which pods the kubelet may have forgotten --------------------------------------------


def test_an_allocated_pod_answered_under_an_earlier_kubelet_is_suspect() -> None:
    x = pod("x", state=STATE_ALLOCATED)
    assert suspect_pods([x], answers={x.uid: answer(x, OLD)}, kubelet=NEW) == [x]
    assert suspect_pods([x], answers={x.uid: answer(x, NEW)}, kubelet=NEW) == []


def test_an_allocated_pod_no_answer_of_this_agent_covers_is_suspect() -> None:
    """An agent restarted without its state file cannot tell which kubelet it was."""
    x = pod("x", state=STATE_ALLOCATED)
    assert suspect_pods([x], answers={}, kubelet=NEW) == [x]


def test_started_running_or_waiting_pods_are_never_suspect() -> None:
    pods = [
        pod("started", state=STATE_ALLOCATED, started=True),
        pod("running", state=STATE_ALLOCATED, phase="Running"),
        pod("assumed"),  # waits anyway; not allocated by anyone
    ]
    assert suspect_pods(pods, answers={}, kubelet=NEW) == []


def test_our_answer_counts_before_the_allocated_mark_shows() -> None:
    x = pod("x")  # the API server does not show our allocated patch yet
    assert suspect_pods([x], answers={x.uid: answer(x, OLD)}, kubelet=NEW) == [x]


def test_the_suspects_the_kubelet_holds_slices_for_are_not_forgotten() -> None:
    x, y = pod("x", state=STATE_ALLOCATED), pod("y", state=STATE_ALLOCATED)
    held = {x.key: (), y.key: (device_id(GPU_A, 0),)}
    assert forgotten_pods([x, y], held) == {x.uid}


def test_a_pod_the_restarted_kubelet_does_not_list_yet_is_not_forgotten() -> None:
    """A restarted kubelet lists a pod (with the slices its checkpoint kept) only once it has
    learnt it from the API server: not listed is not the same as holding nothing."""
    x = pod("x", state=STATE_ALLOCATED)
    assert forgotten_pods([x], {}) == frozenset()
    assert forgotten_pods([x], {x.key: ()}) == {x.uid}


# --- select and steer ---------------------------------------------------------------------


def test_a_forgotten_pod_gets_its_own_placement_not_the_next_pods() -> None:
    """The bug: the plugin skipped the allocated pod and handed it the next assumed pod's."""
    x = pod("x", bind_s=0, threads=10, state=STATE_ALLOCATED)
    y = pod("y", bind_s=1, threads=10)
    found = select_pod([x, y], gpus=frozenset({GPU_A}), sizes=(10,), skip={x.uid}, again={x.uid})
    assert found is not None and found[0].name == "x"
    # Without the kubelet's word the old choice stands: y waits, x does not.
    found = select_pod([x, y], gpus=frozenset({GPU_A}), sizes=(10,), skip={x.uid})
    assert found is not None and found[0].name == "y"


def test_a_forgotten_pod_of_another_size_does_not_take_a_waiting_pods_slices() -> None:
    x = pod("x", bind_s=0, threads=20, state=STATE_ALLOCATED)
    y = pod("y", bind_s=1, threads=10)
    found = select_pod([x, y], gpus=frozenset({GPU_A}), sizes=(10,), again={x.uid})
    assert found is not None and found[0].name == "y"


def test_the_same_slices_as_before_pick_the_pod_they_were_answered_for() -> None:
    x = pod("x", bind_s=1, threads=10, state=STATE_ALLOCATED)
    w = pod("w", bind_s=2, threads=10, state=STATE_ALLOCATED)
    before = {x.uid: tuple(slice_ids(GPU_A)[:10]), w.uid: tuple(slice_ids(GPU_A)[10:20])}
    found = select_pod(
        [x, w],
        gpus=frozenset({GPU_A}),
        sizes=(10,),
        again={x.uid, w.uid},
        previous=before,
        devices=frozenset(before[w.uid]),
    )
    assert found is not None and found[0].name == "w"


def test_steer_offers_a_forgotten_pod_the_slices_it_had() -> None:
    x = pod("x", gpus=GPU_B, bind_s=0, threads=10, state=STATE_ALLOCATED)
    y = pod("y", gpus=GPU_A, bind_s=1, threads=10)
    had = tuple(slice_ids(GPU_B)[40:50])
    available = slice_ids(GPU_A) + slice_ids(GPU_B)
    chosen, steered = steer(
        available, [], 10, [x, y], skip={x.uid}, again={x.uid}, previous={x.uid: had}
    )
    assert (chosen, steered) == (list(had), x.key)
    # Its old slices taken meanwhile: still its GPU, not the next pod's.
    chosen, steered = steer(
        [d for d in available if d not in had[:1]],
        [],
        10,
        [x, y],
        again={x.uid},
        previous={x.uid: had},
    )
    assert steered == x.key and {c.split("::")[0] for c in chosen} == {GPU_B}


# --- the Allocator through a kubelet restart ----------------------------------------------


class ApiServer:
    """The pods bound to the node as the API server stores them (annotations patched)."""

    def __init__(self, pods: list[PodInfo]) -> None:
        self.pods = {p.uid: p for p in pods}
        self.events: list[str] = []

    def list_node_pods(self) -> list[PodInfo]:
        return list(self.pods.values())

    def mark_allocated(self, pod: PodInfo) -> None:
        current = self.pods[pod.uid]
        annotations = {**current.annotations, ANN_STATE: STATE_ALLOCATED}
        self.pods[pod.uid] = replace(current, annotations=annotations)

    def annotate_pod(self, *, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        current = next(p for p in self.pods.values() if p.key == f"{namespace}/{name}")
        self.pods[current.uid] = replace(
            current, annotations={**current.annotations, **annotations}
        )

    def record_event(
        self, *, pod: PodInfo | None, reason: str, message: str, warning: bool
    ) -> None:
        self.events.append(reason)


class Kubelet:
    """What the allocator can see of the kubelet: its identity and what it has checkpointed."""

    def __init__(self) -> None:
        self.identity = OLD
        self.held: dict[str, tuple[str, ...]] = {}
        self.knows: set[str] = set()
        """Pods it lists (with no slices unless ``held`` says), as a kubelet lists every pod
        it has learnt from the API server."""
        self.asked = 0
        self.answering = True

    def list(self) -> Mapping[str, tuple[str, ...]]:
        self.asked += 1
        if not self.answering:
            raise ConnectionError("pod-resources socket not ready")
        return {key: self.held.get(key, ()) for key in self.knows | set(self.held)}


def make(tmp_path: Path, api: ApiServer, kubelet: Kubelet, book: AnswerBook) -> Allocator:
    kubelet.knows |= {p.key for p in api.pods.values()}
    gpus = [
        GpuInfo(u, i, "NVIDIA H100 80GB HBM3", 80 * GIB, 132, "9.0", simulated=True)
        for i, u in enumerate((GPU_A, GPU_B))
    ]
    return Allocator(
        node_name="node-1",
        gpus=lambda: gpus,
        pods=api,
        mps=MpsManager(root=tmp_path / "mps", simulated=True),
        retry_delays_s=(),
        kubelet=lambda: kubelet.identity,
        held=kubelet.list,
        answers=book,
    )


def allocate(allocator: Allocator, size: int) -> dict[str, str]:
    ids = allocator.preferred(slice_ids(GPU_A) + slice_ids(GPU_B), [], size)
    return allocator.allocate([ids])[0].envs


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    return tmp_path / "device-plugins" / "gpushare" / "allocations.json"


def test_every_pod_keeps_its_placement_through_a_kubelet_restart(
    tmp_path: Path, state_file: Path
) -> None:
    x = pod("x", gpus=GPU_B, bind_s=0, threads=5)
    y = pod("y", gpus=GPU_A, bind_s=1, threads=5)
    z = pod("z", gpus=GPU_A, bind_s=2, threads=20)
    api, kubelet = ApiServer([x, y, z]), Kubelet()
    allocator = make(tmp_path, api, kubelet, AnswerBook(path=state_file))
    first = allocate(allocator, 5)
    assert (first["CUDA_VISIBLE_DEVICES"], first["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) == (
        GPU_B,
        "5",
    )
    # The kubelet dies before its checkpoint and comes back: it holds nothing, asks again.
    kubelet.identity = NEW
    again = allocate(allocator, 5)
    assert again == first
    assert api.events == ["GpushareAllocatedAgain"]
    assert allocator.reallocations == 1
    kubelet.held[x.key] = ("checkpointed",)
    # The next pods get their own placements, not one pod further down the queue.
    assert allocate(allocator, 5)["CUDA_VISIBLE_DEVICES"] == GPU_A
    assert allocate(allocator, 20)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"


def test_the_kubelet_is_asked_only_until_every_answer_is_confirmed(
    tmp_path: Path, state_file: Path
) -> None:
    x, y = pod("x", bind_s=0), pod("y", bind_s=1)
    api, kubelet = ApiServer([x, y]), Kubelet()
    allocator = make(tmp_path, api, kubelet, AnswerBook(path=state_file))
    first = allocator.preferred(slice_ids(GPU_A), [], 10)
    allocator.allocate([first])
    kubelet.held = {x.key: tuple(sorted(first))}
    second = allocator.preferred(slice_ids(GPU_A)[10:], [], 10)
    allocator.allocate([second])
    kubelet.held[y.key] = tuple(sorted(second))
    allocator.reconcile()
    asked = kubelet.asked
    assert asked > 0  # each answer was checked against what the kubelet holds
    allocator.reconcile()
    with pytest.raises(AllocationError, match="found no pod"):  # nobody waits: refused
        allocator.allocate([slice_ids(GPU_A)[50:60]])
    assert kubelet.asked == asked  # both confirmed: nothing left to ask about
    kubelet.identity = NEW
    kubelet.held = {x.key: ("a",), y.key: ("b",)}
    with pytest.raises(AllocationError, match="found no pod"):
        allocator.allocate([slice_ids(GPU_A)[60:70]])
    asked = kubelet.asked
    with pytest.raises(AllocationError, match="found no pod"):
        allocator.allocate([slice_ids(GPU_A)[70:80]])
    assert kubelet.asked == asked  # both confirmed held by the new kubelet


def test_allocate_derives_a_placement_only_for_a_pod_gpushare_did_not_place(
    tmp_path: Path, state_file: Path
) -> None:
    """No pod with a gpushare placement waits: a Pending pod without one (another scheduler
    bound it) gets a derived placement and an Event; with no such pod either, Allocate
    refuses instead of handing out a share nobody chose."""
    unplaced = replace(pod("unplaced"), annotations={}, requested_slices=(15,))
    api, kubelet = ApiServer([unplaced]), Kubelet()
    allocator = make(tmp_path, api, kubelet, AnswerBook(path=state_file))
    answer_ = allocator.allocate([slice_ids(GPU_A)[:15]])[0]
    assert answer_.pod is None
    assert answer_.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "15"
    assert api.events == ["GpushareAllocationDerived"]
    # Another size than the unplaced pod asked for: nobody can be the one asking.
    with pytest.raises(AllocationError, match="found no pod on node node-1 waiting for 20"):
        allocator.allocate([slice_ids(GPU_A)[15:35]])
    # Nor once that pod runs.
    api.pods[unplaced.uid] = replace(unplaced, phase="Running", started=True)
    with pytest.raises(AllocationError, match="refusing rather than run a pod"):
        allocator.allocate([slice_ids(GPU_A)[35:50]])
    assert api.events == ["GpushareAllocationDerived"]


def test_answers_survive_an_agent_restart(tmp_path: Path, state_file: Path) -> None:
    x, y = pod("x", bind_s=0), pod("y", bind_s=1)
    api, kubelet = ApiServer([x, y]), Kubelet()
    allocate(make(tmp_path, api, kubelet, AnswerBook(path=state_file)), 10)
    saved = json.loads(state_file.read_text())["answers"]
    assert [(a["pod"], a["kubelet"], len(a["devices"])) for a in saved] == [(x.key, OLD, 10)]
    # A new agent and a new kubelet; the API server never showed x allocated (mark lost).
    api.pods[x.uid] = x
    kubelet.identity = NEW
    allocator = make(tmp_path, api, kubelet, AnswerBook(path=state_file))
    envs = allocate(allocator, 10)
    assert allocator.reallocations == 1 and envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "10"
    # The kubelet now holds x: y, not x again, gets the next slices.
    kubelet.held[x.key] = ("checkpointed",)
    allocator.allocate([slice_ids(GPU_A)[20:30]])
    assert api.pods[y.uid].annotations[ANN_STATE] == STATE_ALLOCATED


def test_an_unreadable_state_file_is_ignored(state_file: Path) -> None:
    state_file.parent.mkdir(parents=True)
    state_file.write_text("{not json")
    assert AnswerBook(path=state_file).all() == {}


def test_pod_info_tells_a_started_pod_from_one_never_started() -> None:
    creating = {"containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}]}
    created = {"containerStatuses": [{"containerID": "containerd://1", "state": {"waiting": {}}}]}
    manifest = {"metadata": {"name": "p", "namespace": "n", "uid": "u"}, "spec": {}}
    assert not pod_info({**manifest, "status": creating}).started
    assert pod_info({**manifest, "status": created}).started
    assert not pod_info(manifest).started


# --- the kubelet admits same-size pods in an order Allocate cannot see -----------------------


def envs_of(allocator: Allocator, ids: list[str]) -> tuple[str, str, str]:
    envs = allocator.allocate([ids])[0].envs
    return (
        envs["CUDA_VISIBLE_DEVICES"],
        envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"],
        envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"],
    )


def described(p: PodInfo) -> tuple[str, str, str]:
    a = p.annotations
    return (a[ANN_GPU_UUID], a[ANN_THREAD_PERCENT], f"0={int(a[ANN_MEMORY_LIMIT]) // 2**20}M")


def test_a_pod_given_another_same_size_pods_answer_ends_up_described_by_it(
    tmp_path: Path, state_file: Path
) -> None:
    """x (older, 8 GiB) and y (20 GiB) both ask 10 slices of GPU A; the kubelet admits y
    first. y runs with x's answer, so y's annotations must say so; x, still waiting, takes y's
    placement over and gets exactly that."""
    x = pod("x", bind_s=0, threads=10, memory_gib=8)
    y = pod("y", bind_s=1, threads=10, memory_gib=20)
    api, kubelet = ApiServer([x, y]), Kubelet()
    allocator = make(tmp_path, api, kubelet, AnswerBook(path=state_file))
    first = slice_ids(GPU_A)[:10]
    given_to_y = envs_of(allocator, first)  # answered for x, the oldest
    kubelet.held[y.key] = tuple(sorted(first))  # ...but the kubelet was admitting y
    given_to_x = envs_of(allocator, slice_ids(GPU_A)[10:20])
    kubelet.held[x.key] = tuple(sorted(slice_ids(GPU_A)[10:20]))
    allocator.reconcile()
    assert described(api.pods[y.uid]) == given_to_y
    assert described(api.pods[x.uid]) == given_to_x
    assert given_to_x != given_to_y  # the two placements really differ
    assert {api.pods[u].annotations[ANN_STATE] for u in (x.uid, y.uid)} == {STATE_ALLOCATED}
    assert allocator.exchanges == 1 and api.events.count("GpusharePlacementExchanged") == 1


def test_answers_given_to_the_pod_meant_are_left_alone() -> None:
    x = pod("x", state=STATE_ALLOCATED, memory_gib=8)
    y = pod("y", memory_gib=20)
    a = Answer(x.uid, x.key, ("A::00",), OLD, 0.0, placement=(), verified=False)
    plan = reconcile([x, y], {x.key: ("A::00",)}, [a])
    assert plan.patches == {} and [h.name for _, h in plan.settled] == ["x"]


def test_the_pod_an_answer_was_meant_for_waits_with_the_placement_left_free() -> None:
    x = pod("x", memory_gib=8, state=STATE_ALLOCATED)  # we marked it; y got its answer
    y = pod("y", gpus=GPU_B, memory_gib=20)
    given = (
        (ANN_GPU_UUID, GPU_A),
        (ANN_THREAD_PERCENT, "10"),
        (ANN_MEMORY_LIMIT, str(8 * GIB)),
    )
    a = Answer(x.uid, x.key, ("A::00",), OLD, 0.0, placement=given, verified=False)
    plan = reconcile([x, y], {y.key: ("A::00",)}, [a])
    assert plan.patches[y.uid][ANN_GPU_UUID] == GPU_A
    assert plan.patches[x.uid] == {
        ANN_GPU_UUID: GPU_B,
        ANN_THREAD_PERCENT: "10",
        ANN_MEMORY_LIMIT: str(20 * GIB),
        ANN_STATE: STATE_ASSUMED,
    }
    assert plan.reopened == {x.uid}


def test_slices_a_restarted_kubelet_gave_out_again_keep_the_later_answer(
    tmp_path: Path, state_file: Path
) -> None:
    """x (older, 12 GiB) and y (8 GiB) both wait for 15 slices of GPU A. The kubelet asks for
    slices D, we answer for x (unverified: two same-size pods wait), and the kubelet dies
    before recording it. The restarted kubelet's pod-resources socket is not up yet when it
    asks for D again for y, so x cannot be seen forgotten and y gets its own answer. y runs
    with its own placement: the stale answer for x must not rewrite y's annotations."""
    x = pod("x", bind_s=0, threads=15, memory_gib=12)
    y = pod("y", bind_s=1, threads=15, memory_gib=8)
    api, kubelet = ApiServer([x, y]), Kubelet()
    allocator = make(tmp_path, api, kubelet, AnswerBook(path=state_file))
    d = slice_ids(GPU_A)[:15]
    assert envs_of(allocator, d)[2] == "0=12288M"  # x's answer; the kubelet then dies
    kubelet.identity, kubelet.answering = NEW, False
    given_to_y = envs_of(allocator, d)
    assert given_to_y == described(api.pods[y.uid]) and given_to_y[2] == "0=8192M"
    kubelet.answering = True
    kubelet.held = {y.key: tuple(sorted(d))}
    assert allocator.reconcile() == 0
    assert described(api.pods[y.uid]) == given_to_y  # y still says what it runs with
    assert described(api.pods[x.uid])[2] == "0=12288M"
    assert "GpusharePlacementExchanged" not in api.events
    # x, forgotten by the new kubelet, gets its own placement when asked again.
    assert envs_of(allocator, slice_ids(GPU_A)[15:30])[2] == "0=12288M"


def placements_after(pods: list[PodInfo], patches: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Each pod's placement (GPU/threads/memory) once ``patches`` are applied, sorted."""
    out = []
    for p in pods:
        a = {**p.annotations, **patches.get(p.uid, {})}
        out.append(f"{a[ANN_GPU_UUID]}/{a[ANN_THREAD_PERCENT]}/{a[ANN_MEMORY_LIMIT]}")
    return sorted(out)


def given(p: PodInfo) -> tuple[tuple[str, str], ...]:
    return tuple(
        (k, p.annotations[k]) for k in (ANN_GPU_UUID, ANN_THREAD_PERCENT, ANN_MEMORY_LIMIT)
    )


def test_answers_that_chain_keep_every_gpus_total() -> None:
    """h got m's answer, r got h's, and m still waits: h and r run with what they got, and m
    must wait with r's vacated placement, not keep its own (then counted twice: h runs with
    it) while r's is counted for nobody."""
    m = pod("m", gpus=GPU_A, bind_s=0, threads=10, memory_gib=4, state=STATE_ALLOCATED)
    h = pod("h", gpus=GPU_B, bind_s=1, threads=10, memory_gib=8)
    r = pod("r", gpus=GPU_A, bind_s=2, threads=10, memory_gib=12)
    pods = [m, h, r]
    a_m = Answer(m.uid, m.key, ("A::00",), OLD, 1.0, placement=given(m), verified=False)
    a_h = Answer(h.uid, h.key, ("B::00",), OLD, 2.0, placement=given(h), verified=False)
    plan = reconcile(pods, {h.key: ("A::00",), r.key: ("B::00",)}, [a_m, a_h])
    assert placements_after(pods, plan.patches) == placements_after(pods, {})  # same totals
    assert plan.patches[h.uid][ANN_MEMORY_LIMIT] == str(4 * GIB)  # h runs with m's answer
    assert plan.patches[r.uid][ANN_MEMORY_LIMIT] == str(8 * GIB)  # r runs with h's answer
    assert plan.patches[m.uid] == {**dict(given(r)), ANN_STATE: STATE_ASSUMED}
    assert plan.reopened == {m.uid}


def test_a_chain_across_two_checks_moves_the_waiting_pod_on() -> None:
    """First check: h holds m's answer, m takes h's placement and waits. Second check: r
    holds the answer once meant for h: m, which carries that placement now, gives it to r."""
    m = pod("m", gpus=GPU_A, bind_s=0, threads=10, memory_gib=4, state=STATE_ALLOCATED)
    h = pod("h", gpus=GPU_B, bind_s=1, threads=10, memory_gib=8)
    r = pod("r", gpus=GPU_A, bind_s=2, threads=10, memory_gib=12)
    a_m = Answer(m.uid, m.key, ("A::00",), OLD, 1.0, placement=given(m), verified=False)
    first = reconcile([m, h, r], {h.key: ("A::00",)}, [a_m])
    after = [
        replace(p, annotations={**p.annotations, **first.patches.get(p.uid, {})}) for p in (m, h, r)
    ]
    a_h = Answer(h.uid, h.key, ("B::00",), OLD, 2.0, placement=given(h), verified=False)
    second = reconcile(after, {h.key: ("A::00",), r.key: ("B::00",)}, [a_h])
    assert placements_after(after, second.patches) == placements_after([m, h, r], {})
    assert second.patches[m.uid] == {**dict(given(r)), ANN_STATE: STATE_ASSUMED}


def test_a_container_the_old_kubelet_started_is_not_taken_for_forgotten(
    tmp_path: Path, state_file: Path
) -> None:
    """x's container was started by the kubelet that died; the new kubelet holds no slices for
    it (it sees the container running and asks nothing) and the API does not show it started
    yet. x is not forgotten: the next Allocate of its size goes to y, and x keeps its
    placement (its container runs with it)."""
    x = pod("x", bind_s=0, threads=10, memory_gib=4)
    y = pod("y", bind_s=1, threads=10, memory_gib=8)
    api, kubelet = ApiServer([x, y]), Kubelet()
    allocator = make(tmp_path, api, kubelet, AnswerBook(path=state_file))
    assert envs_of(allocator, slice_ids(GPU_A)[:10])[2] == "0=4096M"  # x's answer
    kubelet.identity = NEW  # restarted; holds nothing, x's container runs
    allocator.running = lambda: frozenset({x.uid})
    ids = slice_ids(GPU_A)[10:20]
    assert envs_of(allocator, ids) == described(y)
    kubelet.held = {y.key: tuple(sorted(ids))}
    allocator.reconcile()
    assert described(api.pods[x.uid])[2] == "0=4096M"
    assert allocator.reallocations == 0
