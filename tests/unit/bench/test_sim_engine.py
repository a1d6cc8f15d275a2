"""The openb simulator on a tiny synthetic trace it writes itself: constraints hold, FGD packs
better than random, and the CLI writes the results a reader expects."""

import json
import random
import statistics
from pathlib import Path

import pytest

from bench.sim import run
from bench.sim.engine import LEVELS, POLICIES, PRODUCT, arrivals, scheduler_passes, simulate
from bench.sim.profiles import ARCHETYPES, archetype, profile_of
from bench.sim.stock import NodeWindow, chart_nodes_percent, feasible_nodes_to_find
from bench.sim.trace import PodSpec, load_nodes, load_pods
from gpushare.api.errors import InvalidInputError
from gpushare.packing.interference import load_default
from gpushare.packing.model import Demand, GpuState, NodeState, Tenant

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


def write_trace(directory: Path) -> Path:
    """12 nodes of three kinds; pods that fragment GPUs when placed carelessly."""
    rng = random.Random(7)
    nodes = [NODE_HEADER]
    for i in range(12):
        kind = ("T4", 2, 32_000), ("V100M16", 4, 48_000), ("G2", 8, 96_000)
        model, gpus, cpu = kind[i % 3]
        nodes.append(f"node-{i:02d},{cpu},262144,{gpus},{model}\n")
    (directory / "openb_node_list_gpu_node.csv").write_text("".join(nodes))
    pods = [POD_HEADER]
    shapes = [(1, 1000, ""), (1, 600, ""), (1, 450, ""), (1, 300, ""), (2, 1000, ""),
              (0, 0, ""), (1, 500, "T4"), (1, 700, "V100M16|G2")]  # fmt: skip
    for i in range(160):
        num_gpu, milli, spec = rng.choice(shapes)
        cpu = rng.choice((2000, 4000, 8000))
        qos = rng.choice(("LS", "BE"))
        pods.append(f"pod-{i:03d},{cpu},8192,{num_gpu},{milli},{spec},{qos},Running,0,0,0\n")
    (directory / "openb_pod_list_tiny.csv").write_text("".join(pods))
    return directory


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_trace(tmp_path_factory.mktemp("openb"))


def test_every_policy_keeps_gpu_cpu_memory_and_model_constraints(trace: Path) -> None:
    nodes = load_nodes(trace / "openb_node_list_gpu_node.csv")
    pods = load_pods(trace / "openb_pod_list_tiny.csv")
    for policy in POLICIES:
        result = simulate(nodes, pods, policy=policy, seed=3, model=load_default())
        assert result.violations == [], policy
        assert result.placed + result.failed == result.pods
        assert 0 < result.alloc_100 <= result.alloc_130 <= 100
        assert 0 < result.effective_throughput_130 <= result.alloc_130


def test_arrivals_stop_at_130_percent_of_gpu_capacity(trace: Path) -> None:
    pods = load_pods(trace / "openb_pod_list_tiny.csv")
    capacity = 100 * sum(n.gpus for n in load_nodes(trace / "openb_node_list_gpu_node.csv"))
    queue = arrivals(pods, capacity, 1.3, random.Random(1))
    demand = sum(p.gpu_percent_total for p in queue)
    assert 1.3 * capacity - 200 < demand <= 1.3 * capacity
    assert queue != arrivals(pods, capacity, 1.3, random.Random(2))  # seeds change the order


def test_fgd_packs_more_than_random(trace: Path) -> None:
    nodes = load_nodes(trace / "openb_node_list_gpu_node.csv")
    pods = load_pods(trace / "openb_pod_list_tiny.csv")

    def mean_alloc(policy: str) -> float:
        runs = [
            simulate(nodes, pods, policy=policy, seed=s, model=load_default()) for s in range(4)
        ]
        return statistics.fmean(r.alloc_130 for r in runs)

    assert mean_alloc("fgd") >= mean_alloc("random")


def test_cli_writes_json_and_markdown_per_trace_and_policy(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "openb-sim.json"
    args = ["--traces", str(trace), "--seeds", "1,2", "--workers", "1", "--output", str(out)]
    code = run.main([*args, "--policy", "random", "--policy", "fgd", "--policy", "gpushare"])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["seeds"] == [1, 2] and doc["runtime_s"] >= 0 and doc["machine"] and doc["date"]
    row = doc["traces"]["tiny"]["fgd"]
    assert {"alloc_100", "alloc_130", "effective_throughput_130"} <= set(row)
    text = out.with_suffix(".md").read_text()
    assert "| fgd |" in text
    # Issue 69: the allocation at every arrival level, gpushare beside FGD, and a plot.
    assert len(row["curve"]) == len(LEVELS) and row["curve"][LEVELS.index(100)] == row["alloc_100"]
    assert all(a <= b + 1e-9 for a, b in zip(row["curve"], row["curve"][1:], strict=False))
    assert "| gpushare - fgd |" in text and "at every level 10-130% on tiny" in text
    png = out.with_name("openb-sim-curves.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_cli_names_the_flag_when_the_trace_directory_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run.main(["--traces", str(tmp_path / "missing"), "--no-write"]) == 2
    assert "openb_pod_list_*.csv" in capsys.readouterr().err


def test_pod_list_with_a_fractional_percent_is_refused_naming_the_row(tmp_path: Path) -> None:
    (tmp_path / "openb_pod_list_bad.csv").write_text(POD_HEADER + "p,1000,1,1,455,,,,,,\n")
    with pytest.raises(InvalidInputError) as err:
        load_pods(tmp_path / "openb_pod_list_bad.csv")
    assert err.value.field == "openb_pod_list_bad.csv line 2, gpu_milli"


@pytest.mark.parametrize(
    ("kind", "row", "field", "words"),
    [
        ("pod", "p,1e9,1,0,0,,,,,,", "line 2, cpu_milli", "whole number"),
        ("pod", "p,nan,1,0,0,,,,,,", "line 2, cpu_milli", "whole number"),
        ("pod", "p,-5,1,0,0,,,,,,", "line 2, cpu_milli", "outside"),
        ("pod", "p,1000,1,1,500,V100|$(rm -rf),,,,,", "line 2, gpu_spec", "GPU models"),
        ("pod", "p,1000,1,1,500,,,,,,,extra", "line 2", "more fields"),
        ("pod", "../etc,1000,1,0,0,,,,,,", "line 2, name", "pod name"),
        ("pod", "p,1000,1,99,1000,,,,,,", "line 2, num_gpu", "outside"),
        ("node", "Node_1,1000,1024,2,T4", "line 2, sn", "node name"),
        ("node", "n1,1000,1024,2,T4 with spaces", "line 2, model", "GPU model"),
        ("node", "n1,1000,1024,2,", "line 2, model", "empty"),
    ],
)
def test_a_hostile_row_is_refused_naming_file_line_and_field(
    tmp_path: Path, kind: str, row: str, field: str, words: str
) -> None:
    header = POD_HEADER if kind == "pod" else NODE_HEADER
    path = tmp_path / f"openb_{kind}_list_bad.csv"
    good = "ok,1000,1,0,0,,,,,,\n" if kind == "pod" else "ok,1000,1024,2,T4\n"
    path.write_text(header + row + "\n" + good)
    with pytest.raises(InvalidInputError) as err:
        (load_pods if kind == "pod" else load_nodes)(path)
    assert err.value.field == f"{path.name} {field}"
    assert words in err.value.problem or words in err.value.field


def test_simulated_pods_carry_a_measured_sm_utilization_scaled_like_their_load() -> None:
    # Without it the interference model takes every pod to keep its whole thread cap busy.
    whole = PodSpec("p", 4000, 8192, 1, 100, "", "BE")
    small = PodSpec("p", 4000, 8192, 1, 20, "", "BE")
    served = PodSpec("p", 4000, 8192, 1, 100, "", "LS")
    busy = profile_of(whole).sm_utilization
    measured = ARCHETYPES[archetype(whole)][6]
    assert busy is not None and 0.8 * measured <= busy <= min(1.0, 1.2 * measured)
    assert profile_of(small).sm_utilization == pytest.approx(busy * 0.6)
    assert profile_of(served).sm_utilization == pytest.approx(busy * 0.5)


def test_kube_scheduler_offers_a_rotating_share_of_the_feasible_nodes() -> None:
    assert feasible_nodes_to_find(50) == 50
    assert feasible_nodes_to_find(1213) == 497  # 41 % at 1,213 nodes (adaptive)
    assert feasible_nodes_to_find(1213, 10) == 121
    assert feasible_nodes_to_find(300, 10) == 100  # never fewer than 100
    window = NodeWindow(250, 40)
    first = window.candidates(lambda i: i % 2 == 0)
    assert first == list(range(0, 200, 2))  # 100 feasible found after scanning 199 nodes
    second = window.candidates(lambda i: True)
    assert second[0] == 199 and len(second) == 100


def test_kube_scheduler_offers_only_nodes_with_the_gpu_share_in_total() -> None:
    """As the chart configures it, kube-scheduler's own fit counts gpushare.io/gpu-percent per
    node (tests/chart/test_scheduler_configmap.py): a node whose healthy GPUs have less free
    share in total than the pod asks is never offered to the extender; which GPU has room is
    the extender's to say."""
    gib = 2**30

    def busy(uuid: str, used: int, *, healthy: bool = True) -> GpuState:
        return GpuState(uuid, 80 * gib, healthy=healthy, tenants=[Tenant(f"ns/{uuid}", used, gib)])

    node = NodeState("n", [busy("g0", 60), busy("g1", 60)], 64_000, 256 * gib)
    assert scheduler_passes(node, Demand(percent=50))  # 80% free in total, 40% on each GPU
    assert not scheduler_passes(node, Demand(percent=90))
    assert not scheduler_passes(
        NodeState("n", [busy("g0", 0), busy("g1", 60)]), Demand(100, gpus=2)
    )
    assert scheduler_passes(NodeState("n", [busy("g0", 0), busy("g1", 0)]), Demand(100, gpus=2))
    # The kubelet advertises no share for an unhealthy GPU.
    sick = NodeState("n", [busy("g0", 0, healthy=False), busy("g1", 60)])
    assert not scheduler_passes(sick, Demand(percent=50))
    assert scheduler_passes(node, Demand(percent=0, cpu_milli=1000))  # a pod without GPUs


def test_the_product_rows_are_the_placer_and_the_chart_sets_how_many_nodes_it_sees(
    trace: Path,
) -> None:
    assert set(PRODUCT) <= set(POLICIES)
    assert chart_nodes_percent() is None  # the chart keeps kube-scheduler's adaptive share
