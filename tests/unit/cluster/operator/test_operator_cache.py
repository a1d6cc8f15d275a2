"""The profile cache: one entry per image + command + GPU model, newest wins, damage tolerated."""

from datetime import UTC, datetime, timedelta

from gpushare.api.profile import PLACEMENT_COUNTERS, GpuProfile
from gpushare.cluster.operator.cache import (
    CacheEntry,
    cache_key,
    encode_entry,
    evictable_keys,
    lookup,
)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
IMAGE = "registry.local/train:1"


def profile(model: str, tensor: float, *, minutes: int = 0) -> GpuProfile:
    return GpuProfile(
        gpu_model=model,
        **dict(zip(PLACEMENT_COUNTERS, (0.0, 0.1, 0.0, tensor, 0.5, 0.3), strict=True)),
        memory_used_bytes_max=2**33,
        sampled_seconds=60.0,
        time=T0 + timedelta(minutes=minutes),
    )


def store(*entries: CacheEntry) -> dict[str, str]:
    return {
        cache_key(image=e.image, command=e.command, gpu_model=e.gpu_model): encode_entry(e)
        for e in entries
    }


def test_keys_are_configmap_safe_and_distinguish_argument_boundaries() -> None:
    a = cache_key(image=IMAGE, command=("python", "train.py --big"), gpu_model="NVIDIA H200")
    b = cache_key(image=IMAGE, command=("python", "train.py", "--big"), gpu_model="NVIDIA H200")
    c = cache_key(
        image=IMAGE, command=("python", "train.py", "--big"), gpu_model="NVIDIA H100 80GB HBM3"
    )
    assert len({a, b, c}) == 3
    assert all(ch.isalnum() or ch in "-._" for ch in a + b + c)


def test_lookup_finds_the_same_job_on_a_gpu_model_the_cluster_has() -> None:
    cmd = ("python", "train.py")
    data = store(
        CacheEntry(IMAGE, cmd, "NVIDIA H200", profile("NVIDIA H200", 0.78)),
        CacheEntry(
            IMAGE, cmd, "NVIDIA A100-SXM4-80GB", profile("NVIDIA A100-SXM4-80GB", 0.5, minutes=5)
        ),
    )
    found = lookup(data, image=IMAGE, command=cmd, gpu_models={"NVIDIA H200", "NVIDIA L4"})
    assert found is not None and found.gpu_model == "NVIDIA H200" and found.tensor == 0.78
    newest = lookup(
        data, image=IMAGE, command=cmd, gpu_models={"NVIDIA H200", "NVIDIA A100-SXM4-80GB"}
    )
    assert newest is not None and newest.gpu_model == "NVIDIA A100-SXM4-80GB"
    assert (
        lookup(data, image=IMAGE, command=("python", "eval.py"), gpu_models={"NVIDIA H200"}) is None
    )
    assert lookup(data, image=IMAGE + "-v2", command=cmd, gpu_models={"NVIDIA H200"}) is None


def test_damaged_entry_costs_a_reprofile_not_a_crash() -> None:
    cmd = ("python", "train.py")
    key = cache_key(image=IMAGE, command=cmd, gpu_model="NVIDIA H200")
    assert lookup({key: "{garbage"}, image=IMAGE, command=cmd, gpu_models={"NVIDIA H200"}) is None


def test_oldest_and_damaged_entries_are_dropped_first() -> None:
    entries = [
        CacheEntry(IMAGE, (f"job{i}",), "NVIDIA H200", profile("NVIDIA H200", 0.1, minutes=i))
        for i in range(4)
    ]
    data = store(*entries)
    data["profile-broken"] = "not json"
    data["unrelated-key"] = "kept"
    dropped = evictable_keys(data, keep=3)
    assert dropped == [
        "profile-broken",
        cache_key(image=IMAGE, command=("job0",), gpu_model="NVIDIA H200"),
    ]
    assert evictable_keys(data, keep=10) == []
