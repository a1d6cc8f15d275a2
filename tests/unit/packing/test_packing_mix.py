"""PodMix: the pod-size mix the gpushare policy learns from the pods it sees."""

import pytest

from gpushare.packing.fragmentation import Workload
from gpushare.packing.mix import PodMix, shape_of
from gpushare.packing.model import Demand

GIB = 1 << 30


def quarter(cpu: int = 4000) -> Demand:
    return Demand(percent=25, cpu_milli=cpu, host_memory_bytes=16 * GIB)


def test_the_prior_stands_in_until_the_first_refit() -> None:
    mix = PodMix(refit_every=3)
    assert mix.workload is Workload.default() and mix.generation == 0
    assert not mix.observe(quarter()) and not mix.observe(quarter())
    assert mix.workload is Workload.default()
    assert mix.observe(quarter())
    assert mix.generation == 1
    (task,) = mix.workload.tasks
    assert (task.percent, task.gpus, task.cpu_milli, task.host_memory_bytes) == (
        25,
        1,
        4000,
        16 * GIB,
    )


def test_cpu_and_memory_of_the_pods_seen_feed_the_stranding_term() -> None:
    mix = PodMix(refit_every=2)
    mix.observe(quarter(cpu=8000))
    mix.observe(Demand(percent=100, gpus=2, cpu_milli=16000, host_memory_bytes=64 * GIB))
    workload = mix.workload
    # 8000 + 16000 milli-CPU over 25 + 200 GPU-percent.
    assert workload.cpu_per_percent == pytest.approx(24000 / 225)
    assert workload.memory_per_percent == pytest.approx(80 * GIB / 225)
    # A node whose CPU can feed only half its free GPU share strands the other half.
    assert workload.stranded(100, 50 * 24000 // 225, None) == pytest.approx(50, abs=0.01)


def test_pods_without_gpus_count_as_cpu_only_tasks() -> None:
    assert shape_of(Demand(percent=0, gpus=0, cpu_milli=2000, host_memory_bytes=GIB)) == (
        0,
        0,
        2000,
        None,
        GIB,
    )
    mix = PodMix(refit_every=2)
    mix.observe(Demand(percent=0, gpus=0, cpu_milli=2000))
    mix.observe(quarter())
    assert sorted(t.gpus for t in mix.workload.tasks) == [0, 1]


def test_refits_thin_out_as_the_mix_settles() -> None:
    mix = PodMix(refit_every=10, refit_growth=0.5)
    refits = [n for n in range(1, 201) if mix.observe(quarter(cpu=1000 * (n % 3 + 1)))]
    # Every 10 pods until 20 were counted, then once the new pods reach half of all counted.
    assert refits[:2] == [10, 20]
    assert refits == [10, 20, 40, 80, 160]
    assert mix.generation == len(refits)


def test_memory_is_bounded_by_shapes_and_by_the_horizon() -> None:
    mix = PodMix(refit_every=50, max_shapes=8, horizon=40)
    for n in range(100):
        mix.observe(quarter(cpu=100 * n))  # 100 distinct shapes
    assert len(mix.shapes()) <= 8
    assert sum(mix.shapes().values()) <= 40
    assert mix.observed == 100


def test_a_mix_that_changes_is_followed() -> None:
    mix = PodMix(refit_every=20, horizon=100)
    for _ in range(200):
        mix.observe(Demand(percent=100, cpu_milli=8000))
    for _ in range(400):
        mix.observe(quarter())
    weights = {t.percent: t.weight for t in mix.workload.tasks}
    assert weights[25] > 0.9


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        PodMix(refit_every=0)


def test_a_pod_taken_back_leaves_the_mix_as_if_it_never_came() -> None:
    """Issue 67: a pod deleted before it was bound is taken back (``unobserve``): the counts
    are the pods that stayed at once; the removals count towards refits as arrivals do (the
    refits stay as far apart, so a churning tenant cannot make the extender drop its kept
    answers any faster), and by the next refit the fitted mix is theirs alone."""

    def odd_weight() -> float:
        return sum(t.weight for t in mix.workload.tasks if t.percent == 7)

    mix = PodMix(refit_every=10, refit_growth=0.5)
    for _ in range(20):
        mix.observe(quarter())
    odd = Demand(percent=7, gpus=1, cpu_milli=1000, host_memory_bytes=GIB)
    for _ in range(40):
        mix.observe(odd)
    skewed = odd_weight()
    assert skewed >= 0.5
    generation = mix.generation
    refits = sum(mix.unobserve(odd, mix.halvings) for _ in range(40))
    assert mix.shapes() == {shape_of(quarter()): 20.0}
    assert 1 <= refits <= 4 and mix.generation == generation + refits
    assert odd_weight() < skewed
    arrivals = next(n for n in range(1, 100) if mix.observe(quarter()))
    assert arrivals <= 20
    assert [t.percent for t in mix.workload.tasks] == [25]
    # A shape already forgotten is left alone.
    before = mix.shapes()
    mix.unobserve(odd, mix.halvings)
    assert mix.shapes() == before


def test_a_pod_counted_before_a_halving_is_taken_back_at_its_weight_now() -> None:
    mix = PodMix(horizon=4, refit_every=100)
    then = mix.halvings
    for _ in range(3):
        mix.observe(quarter())
    mix.observe(quarter(cpu=8000))
    mix.observe(quarter(cpu=8000))  # the fifth pod passes the horizon: every count halves
    assert mix.halvings == then + 1
    assert mix.shapes()[shape_of(quarter())] == 1.5
    mix.unobserve(quarter(), then)
    assert mix.shapes()[shape_of(quarter())] == 1.0
