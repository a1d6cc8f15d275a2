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
H200 = "NVIDIA H200"


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
    assert evictable_keys(data, keep=10) == ["profile-broken"]  # damage goes whatever the room


def test_a_profile_sizes_only_the_tenancy_that_measured_it() -> None:
    """Issue 67: the cache was keyed by image, command and GPU model: another tenant's
    ``fraction: auto`` share was sized to 5% from the attacker's idle run."""
    cmd = ("python", "train.py")
    idle = CacheEntry(IMAGE, cmd, "NVIDIA H200", profile("NVIDIA H200", 0.01), "attacker")
    data = {
        cache_key(image=IMAGE, command=cmd, gpu_model="NVIDIA H200", tenancy="attacker"): (
            encode_entry(idle)
        )
    }
    models = {"NVIDIA H200"}
    assert lookup(data, image=IMAGE, command=cmd, gpu_models=models, tenancy="victim") is None
    mine = lookup(data, image=IMAGE, command=cmd, gpu_models=models, tenancy="attacker")
    assert mine is not None and mine.tensor == 0.01
    # An entry copied under the victim's key still names the attacker's tenancy: no match.
    forged = {
        cache_key(image=IMAGE, command=cmd, gpu_model="NVIDIA H200", tenancy="victim"): (
            encode_entry(idle)
        )
    }
    assert lookup(forged, image=IMAGE, command=cmd, gpu_models=models, tenancy="victim") is None


def test_one_tenancy_filling_the_cache_never_stops_another_ones_entries() -> None:
    """Long command lines of one tenant filled the single 1 MiB ConfigMap and every later write
    failed for everyone: entries are shortened, each tenancy keeps at most ``per_tenancy``, and
    the whole cache stays under ``max_bytes``."""
    huge = ("x" * 200_000,)
    flood = [
        CacheEntry(
            IMAGE, (*huge, str(i)), "NVIDIA H200", profile("NVIDIA H200", 0.1, minutes=i), "a"
        )
        for i in range(100)
    ]
    data = {
        cache_key(image=e.image, command=e.command, gpu_model=e.gpu_model, tenancy="a"): (
            encode_entry(e)
        )
        for e in flood
    }
    assert max(len(v) for v in data.values()) < 4096
    victim = CacheEntry(
        IMAGE, ("train",), "NVIDIA H200", profile("NVIDIA H200", 0.7, minutes=-5), "b"
    )
    victim_key = cache_key(image=IMAGE, command=("train",), gpu_model="NVIDIA H200", tenancy="b")
    data[victim_key] = encode_entry(victim)
    dropped = set(evictable_keys(data, keep=512, per_tenancy=32, max_bytes=64 * 1024))
    kept = {k: v for k, v in data.items() if k not in dropped}
    assert victim_key in kept  # the oldest entry, but its tenancy's only one
    assert sum(1 for k in kept if k != victim_key) == 32
    assert sum(len(k) + len(v) for k, v in kept.items()) <= 64 * 1024
    found = lookup(kept, image=IMAGE, command=("train",), gpu_models={"NVIDIA H200"}, tenancy="b")
    assert found is not None and found.tensor == 0.7


def test_a_deeply_nested_cache_value_is_a_damaged_entry_not_a_recursion_error() -> None:
    """38 of the last fuzz's uncaught inputs: a nested value raised RecursionError."""
    cmd = ("python", "train.py")
    key = cache_key(image=IMAGE, command=cmd, gpu_model="NVIDIA H200")
    for text in ("[" * 100_000, '{"profile":' * 5000, '{"a":' + "[" * 3000):
        assert lookup({key: text}, image=IMAGE, command=cmd, gpu_models={"NVIDIA H200"}) is None
        assert evictable_keys({key: text}, keep=10) == [key]
