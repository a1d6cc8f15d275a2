"""MPS limits the daemon and servers enforce: the commands, the largest placed share per GPU,
and when the node agent raises or lowers them. Enforcement itself is measured on a real GPU
(tests/gpu/test_mps_limits_gpu.py)."""

from pathlib import Path

from gpushare.api.names import (
    ANN_BIND_TIME,
    ANN_GPU_UUID,
    ANN_MEMORY_LIMIT,
    ANN_STATE,
    ANN_THREAD_PERCENT,
)
from gpushare.api.pod import PodInfo, pod_info
from gpushare.node.faults.tailing import MAX_LINE, LogTail
from gpushare.node.mps.limits import (
    FLOOR,
    MIB,
    MpsLimitKeeper,
    ServerLimits,
    largest,
    placed_shares,
)
from gpushare.node.mps.manager import MpsManager

GPU = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
OTHER = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
GIB = 2**30


def test_commands_set_the_daemon_defaults_and_each_running_server() -> None:
    limits = ServerLimits(25, 2 * GIB)
    assert limits.commands([4242]) == [
        "set_default_active_thread_percentage 25",
        "set_default_device_pinned_mem_limit 0 2048M",
        "set_active_thread_percentage 4242 25",
        "set_device_pinned_mem_limit 4242 0 2048M",
    ]


def test_the_largest_placed_share_bounds_every_client() -> None:
    assert largest([(25, 2 * GIB), (50, GIB), (10, 8 * GIB)], floor=FLOOR) == ServerLimits(
        50, 8 * GIB
    )
    assert largest([], floor=FLOOR) == FLOOR
    assert largest([(250, 0)], floor=FLOOR) == ServerLimits(100, MIB)


def placed(name: str, gpu: str, threads: int, memory: int, *, phase: str = "Running") -> PodInfo:
    return pod_info(
        {
            "metadata": {
                "name": name,
                "annotations": {
                    ANN_GPU_UUID: gpu,
                    ANN_THREAD_PERCENT: str(threads),
                    ANN_MEMORY_LIMIT: str(memory),
                    ANN_BIND_TIME: "2026-01-01T00:00:00Z",
                    ANN_STATE: "allocated",
                },
            },
            "status": {"phase": phase},
        }
    )


def test_shares_count_live_single_gpu_placements_and_fill_in_proportional_memory() -> None:
    pods = [
        placed("a", GPU, 25, 4 * GIB),
        placed("b", GPU, 40, 0),  # no memory limit: Allocate gives 40 % of the GPU
        placed("done", GPU, 90, GIB, phase="Succeeded"),
        placed("whole", f"{GPU},{OTHER}", 100, 0),
        pod_info({"metadata": {"annotations": {ANN_GPU_UUID: GPU, ANN_THREAD_PERCENT: "x"}}}),
    ]
    shares = placed_shares(pods, {GPU: 80 * GIB, OTHER: 80 * GIB})
    assert sorted(shares[GPU]) == [(25, 4 * GIB), (40, 32 * GIB)]
    assert OTHER not in shares


def test_allocate_raises_at_once_and_the_sync_lowers_only_after_the_hold(tmp_path: Path) -> None:
    now = [0.0]
    mps = MpsManager(root=tmp_path, simulated=True)
    keeper = MpsLimitKeeper(
        mps=mps, gpu_memory=lambda: {GPU: 80 * GIB}, hold_s=60, clock=lambda: now[0]
    )
    assert keeper.sync([]) == {GPU: FLOOR}  # nothing placed: nothing may connect with more
    keeper.raise_for(GPU, 50, 10 * GIB)  # Allocate, before the container starts
    assert mps.limits(GPU) == ServerLimits(50, 10 * GIB)
    # The pod list does not show the pod yet: the limits are kept within the hold.
    now[0] = 10
    assert keeper.sync([placed("a", GPU, 25, 4 * GIB)])[GPU] == ServerLimits(50, 10 * GIB)
    now[0] = 100
    assert keeper.sync([placed("a", GPU, 25, 4 * GIB)])[GPU] == ServerLimits(25, 4 * GIB)
    keeper.raise_for(GPU, 10, GIB)  # a smaller pod never lowers the others' limit
    assert mps.limits(GPU) == ServerLimits(25, 4 * GIB)


def test_a_log_flood_is_read_in_bounded_chunks(tmp_path: Path) -> None:
    """An 8 MiB append is taken in 256 KiB chunks; an over-long line is dropped, not kept."""
    log = tmp_path / "server.log"
    log.write_text("")
    tail = LogTail(log, from_start=False)
    assert tail.read() == []
    line = "[2026-01-01 00:00:00.000 Server 42] Client 7 connected\n"
    with log.open("a") as handle:
        handle.write("x" * (MAX_LINE * 3) + "\n")
        handle.write(line * ((8 * 2**20) // len(line)))
    reads = 0
    total = 0
    while True:
        lines = tail.read()
        reads += 1
        total += len(lines)
        assert sum(len(x) for x in lines) <= tail.chunk
        if not tail.behind:
            break
    assert reads >= 8 * 2**20 // tail.chunk
    assert total == (8 * 2**20) // len(line)
    assert tail.dropped_lines == 1
