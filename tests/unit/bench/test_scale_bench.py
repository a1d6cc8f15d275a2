"""The scale bench's pure parts: what it submits, how it checks the packing, how it reads
/metrics. (The end-to-end run is tests/cluster/test_scale_smoke.py.)"""

import asyncio
import copy
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bench.extender import scale_flow
from bench.scale import dra, floor, harness, metrics
from bench.scale.combine import combine, label_of
from bench.scale.floor import FloorExtender
from bench.scale.harness import machine_description
from bench.scale.invariant import check
from bench.scale.phase import PhaseTiming, steady_rate
from bench.scale.report import render_markdown
from bench.scale.run import _sample_file, assemble, parse_args, scheduler_summary
from bench.scale.workload import (
    NodeShape,
    TracePod,
    fraction_text,
    fractional_pod,
    gpu_uuid,
    node_manifest,
    node_name,
    read_trace,
    take,
    whole_gpu_pod,
)
from gpushare.api.dra import DEVICE_CLASS, POD_CLAIM
from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import load_inventory
from gpushare.api.names import (
    ANN_CLASS,
    ANN_FRACTION,
    ANN_GPU_UUID,
    ANN_NODE_GPUS,
    ANN_STATE,
    ANN_THREAD_PERCENT,
    RESOURCE_GPU_PERCENT,
    SCHEDULER_NAME,
)
from gpushare.api.placement import Placement
from gpushare.api.request import parse_request
from gpushare.cluster import main as controller
from gpushare.cluster.extender.args import parse_binding_args, parse_extender_args
from gpushare.cluster.webhook.claims import claim_template
from tests import REPO

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
    "deletion_time,scheduled_time\n"
)
REAL_TRACES = REPO.parent / "shared" / "traces" / "openb"


def _trace(tmp_path: Path, rows: list[str], name: str = "pods.csv") -> Path:
    (tmp_path / name).write_text(HEADER + "".join(r + "\n" for r in rows))
    return tmp_path


# ---- workload -------------------------------------------------------------------------------


def test_trace_keeps_single_gpu_tasks_in_arrival_order(tmp_path: Path) -> None:
    traces = _trace(
        tmp_path,
        [
            "p-late,6000,12288,1,470,,BE,Running,50,100,50",
            "p-cpu,8000,30517,0,0,,BE,Running,1,100,1",
            "p-multi,32000,65536,8,1000,,LS,Running,2,100,2",
            "p-early,4000,8192,1,230,,LS,Running,3,100,3",
            "p-whole,12000,16384,1,1000,,LS,Running,4,100,4",
        ],
    )
    pods = read_trace(traces, file="pods.csv")
    assert [p.name for p in pods] == ["p-early", "p-whole", "p-late"]
    assert [p.percent for p in pods] == [23, 100, 47]
    assert [p.gpu_class for p in pods] == ["latency", "latency", "batch"]


def test_take_cycles_through_the_trace_for_more_pods_than_it_has(tmp_path: Path) -> None:
    pods = read_trace(
        _trace(
            tmp_path,
            [
                "a,1000,1024,1,500,,BE,Running,1,2,1",
                "b,1000,1024,1,1000,,BE,Running,2,3,2",
                "c,1000,1024,1,250,,BE,Running,3,4,3",
            ],
        ),
        file="pods.csv",
    )
    assert [p.name for p in take(pods, 5, fractional=True)] == ["a", "c", "a", "c", "a"]
    assert [p.name for p in take(pods, 2, fractional=False)] == ["b", "b"]


def test_missing_trace_directory_names_the_flag_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError) as err:
        read_trace(tmp_path / "nowhere")
    assert err.value.field == "--traces"
    assert "openb" in err.value.fix


def test_missing_trace_file_and_bad_rows_are_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError) as err:
        read_trace(tmp_path, file="absent.csv")
    assert err.value.field == "--trace-file"
    (tmp_path / "short.csv").write_text("name,cpu_milli\nx,1\n")
    with pytest.raises(InvalidInputError) as err:
        read_trace(tmp_path, file="short.csv")
    assert "gpu_milli" in err.value.problem
    _trace(tmp_path, ["x,lots,1024,1,500,,BE,Running,1,2,1"], name="bad.csv")
    with pytest.raises(InvalidInputError) as err:
        read_trace(tmp_path, file="bad.csv")
    assert err.value.field == "bad.csv line 2"


def test_a_trace_without_fractional_tasks_is_refused(tmp_path: Path) -> None:
    pods = read_trace(_trace(tmp_path, ["b,1000,1024,1,1000,,BE,Running,2,3,2"]), file="pods.csv")
    with pytest.raises(InvalidInputError, match="no fractional"):
        take(pods, 3, fractional=True)


@pytest.mark.skipif(
    not REAL_TRACES.is_dir(),
    reason=f"openb traces not found in {REAL_TRACES} (the checkout's ../shared/traces/openb)",
)
def test_real_openb_trace_yields_fractional_shares_only() -> None:
    pods = take(read_trace(REAL_TRACES), 500, fractional=True)
    assert len(pods) == 500
    assert all(1 <= p.percent <= 99 for p in pods)
    assert len({p.percent for p in pods}) > 5


def test_fractional_pod_is_what_the_webhook_would_let_through() -> None:
    task = TracePod("openb-pod-0001", 6000, 12288, 470, "LS", 427061)
    pod = fractional_pod(7, task, namespace="ns")
    request = parse_request(pod["metadata"]["annotations"])
    assert request is not None
    assert request.percent == 47
    assert request.gpu_class == "latency"
    res = pod["spec"]["containers"][0]["resources"]
    assert res["limits"][RESOURCE_GPU_PERCENT] == res["requests"][RESOURCE_GPU_PERCENT] == "47"
    assert pod["spec"]["schedulerName"] == SCHEDULER_NAME
    assert res["requests"]["cpu"] == "6000m"


def test_dra_phase_asks_what_the_webhook_and_the_agent_would_make() -> None:
    task = TracePod("openb-pod-0001", 6000, 12288, 470, "LS", 427061)
    claim = dra.claim(7, task, namespace="ns")
    request = parse_request({ANN_FRACTION: "0.47", ANN_CLASS: "latency"})
    assert request is not None
    assert (
        claim["spec"]
        == claim_template(request, namespace="ns", device_class=DEVICE_CLASS)["spec"]["spec"]
    )
    pod = dra.pod(7, task, namespace="ns")
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["claims"] == [{"name": POD_CLAIM}]
    assert RESOURCE_GPU_PERCENT not in json.dumps(pod)
    assert pod["spec"]["resourceClaims"] == [
        {"name": POD_CLAIM, "resourceClaimName": claim["metadata"]["name"]}
    ]
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    devices = dra.node_slice("kwok-node-0", NodeShape())["spec"]["devices"]
    assert len(devices) == 8 and all(d["allowMultipleAllocations"] for d in devices)


def test_dra_check_counts_every_gpu_handed_out_beyond_100_percent() -> None:
    def allocated(pool: str, device: str, percent: int) -> dict[str, Any]:
        result = {"pool": pool, "device": device, "consumedCapacity": {"gpuPercent": str(percent)}}
        return {"status": {"allocation": {"devices": {"results": [result]}}}}

    fine = dra.check([allocated("n0", "gpu-0", 60), allocated("n0", "gpu-0", 40), {}])
    assert (fine["claims_allocated"], fine["violations"], fine["gpus_used"]) == (2, 0, 1)
    over = dra.check([allocated("n0", "gpu-0", 60), allocated("n0", "gpu-0", 50)])
    assert over["violations"] == 1 and over["violation_examples"] == ["n0/gpu-0: 110%"]


def test_whole_gpu_reference_pod_uses_the_stock_scheduler_and_no_annotations() -> None:
    pod = whole_gpu_pod(0, TracePod("t", 11300, 40000, 1000, "BE", 0), namespace="ns")
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert pod["metadata"]["annotations"] == {}
    assert pod["spec"]["containers"][0]["resources"]["limits"][RESOURCE_GPU_PERCENT] == "100"


@pytest.mark.parametrize(("percent", "text"), [(47, "0.47"), (50, "0.5"), (5, "0.05"), (100, "1")])
def test_fraction_text_round_trips_through_the_annotation_parser(percent: int, text: str) -> None:
    assert fraction_text(percent) == text
    request = parse_request({"gpushare.io/gpu-fraction": text})
    assert request is not None
    assert request.percent == percent


def test_fake_node_advertises_eight_gpus_and_their_inventory() -> None:
    node = node_manifest(3, NodeShape())
    assert node["status"]["allocatable"][RESOURCE_GPU_PERCENT] == "800"
    gpus = load_inventory(node["metadata"]["annotations"][ANN_NODE_GPUS])
    assert len(gpus) == 8
    assert len({g.uuid for g in gpus}) == 8
    assert all(g.simulated and g.mps_ready for g in gpus)
    assert node["metadata"]["labels"]["gpushare.io/mps-capable"] == "true"
    assert node["metadata"]["labels"]["gpushare.io/simulated"] == "true"
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert gpu_uuid(node_name(3), 0) != gpu_uuid(node_name(4), 0)


# ---- invariant ------------------------------------------------------------------------------


def _placed(name: str, node: str, gpu: str, percent: int, memory: int = 0) -> dict[str, Any]:
    pod = fractional_pod(0, TracePod(name, 1000, 1024, percent * 10, "BE", 0), namespace="ns")
    pod["metadata"]["name"] = name
    placement = Placement((gpu,), percent, memory, datetime.now(UTC), "allocated")
    pod["metadata"]["annotations"].update(placement.to_annotations())
    pod["spec"]["nodeName"] = node
    return pod


def _nodes(count: int = 2) -> list[dict[str, Any]]:
    return [node_manifest(i, NodeShape()) for i in range(count)]


GIB = 2**30


def test_a_valid_packing_has_no_violations() -> None:
    n0, g0 = node_name(0), gpu_uuid(node_name(0), 0)
    pods = [
        _placed("a", n0, g0, 47, 37 * GIB),
        _placed("b", n0, g0, 53, 42 * GIB),
        _placed("c", n0, gpu_uuid(n0, 1), 81, 64 * GIB),
    ]
    report = check(_nodes(), pods)
    assert report.violations == []
    assert report.gpus == 16
    assert report.gpus_used == 2
    assert report.max_percent == 100
    assert report.pods_placed == 3


def test_oversubscribed_gpu_is_reported_by_name() -> None:
    n0, g0 = node_name(0), gpu_uuid(node_name(0), 0)
    report = check(_nodes(), [_placed("a", n0, g0, 60), _placed("b", n0, g0, 47)])
    assert any(g0 in v and "107%" in v for v in report.violations)


def test_memory_caps_beyond_the_gpu_are_reported() -> None:
    n0, g0 = node_name(0), gpu_uuid(node_name(0), 0)
    report = check(
        _nodes(), [_placed("a", n0, g0, 20, 50 * GIB), _placed("b", n0, g0, 20, 40 * GIB)]
    )
    assert any("memory" in v and g0 in v for v in report.violations)


def test_more_pods_than_mps_clients_on_one_gpu_is_reported() -> None:
    n0, g0 = node_name(0), gpu_uuid(node_name(0), 0)
    pods = [_placed(f"p{i}", n0, g0, 1, GIB) for i in range(49)]
    report = check(_nodes(), pods)
    assert any("MPS client limit 48" in v for v in report.violations)
    assert report.max_pods_per_gpu == 49


def test_pod_placed_on_a_gpu_of_another_node_is_reported() -> None:
    report = check(_nodes(), [_placed("a", node_name(1), gpu_uuid(node_name(0), 2), 30)])
    assert any("bound to kwok-gpu-0001" in v for v in report.violations)


def test_bound_pod_without_placement_is_reported_and_pending_pods_are_counted() -> None:
    bound = fractional_pod(1, TracePod("t", 1000, 1024, 300, "BE", 0), namespace="ns")
    bound["spec"]["nodeName"] = node_name(0)
    pending = fractional_pod(2, TracePod("t", 1000, 1024, 300, "BE", 0), namespace="ns")
    report = check(_nodes(), [bound, pending])
    assert any("without a GPU placement" in v for v in report.violations)
    assert report.pods_unbound == 1


def test_finished_pods_do_not_count() -> None:
    n0, g0 = node_name(0), gpu_uuid(node_name(0), 0)
    done = _placed("done", n0, g0, 90)
    done["status"] = {"phase": "Succeeded"}
    report = check(_nodes(), [done, _placed("a", n0, g0, 90)])
    assert report.violations == []


def test_unreadable_placement_is_a_violation() -> None:
    n0, g0 = node_name(0), gpu_uuid(node_name(0), 0)
    pod = _placed("a", n0, g0, 30)
    pod["metadata"]["annotations"][ANN_THREAD_PERCENT] = "lots"
    pod["metadata"]["annotations"][ANN_STATE] = "allocated"
    assert pod["metadata"]["annotations"][ANN_GPU_UUID] == g0
    report = check(_nodes(), [pod])
    assert any("unreadable" in v for v in report.violations)


# ---- metrics --------------------------------------------------------------------------------

PAGE = """
# HELP x_seconds latency
# TYPE x_seconds histogram
x_seconds_bucket{verb="filter",le="0.001"} 10
x_seconds_bucket{verb="filter",le="0.005"} 90
x_seconds_bucket{verb="filter",le="0.01"} 100
x_seconds_bucket{verb="filter",le="+Inf"} 100
x_seconds_sum{verb="filter"} 0.3
x_seconds_count{verb="filter"} 100
x_seconds_bucket{verb="bind",le="0.001"} 0
x_seconds_bucket{verb="bind",le="0.005"} 0
x_seconds_bucket{verb="bind",le="0.01"} 1
x_seconds_bucket{verb="bind",le="+Inf"} 2
x_seconds_sum{verb="bind"} 0.5
x_seconds_count{verb="bind"} 2
# HELP scheduler_cache_size cache
# TYPE scheduler_cache_size gauge
scheduler_cache_size{type="nodes"} 1000
scheduler_cache_size{type="pods"} 7
"""


def test_histogram_quantiles_interpolate_within_buckets() -> None:
    h = metrics.histogram(PAGE, "x_seconds", lambda labels: labels["verb"] == "filter")
    assert h.count == 100
    assert h.quantile(0.5) == pytest.approx(0.001 + 0.004 * (50 - 10) / 80)
    assert h.quantile(0.99) == pytest.approx(0.005 + 0.005 * 9 / 10)
    summary = metrics.summarize(h)
    assert summary["p99_bucket_ms"] == [5.0, 10.0]
    assert summary["mean_ms"] == 3.0


def test_histogram_delta_only_counts_the_phase() -> None:
    before = metrics.histogram(PAGE, "x_seconds")
    later = PAGE.replace('le="+Inf"} 100', 'le="+Inf"} 150').replace(
        'x_seconds_count{verb="filter"} 100', 'x_seconds_count{verb="filter"} 150'
    )
    later = later.replace('le="0.01"} 100', 'le="0.01"} 150')
    delta = metrics.histogram(later, "x_seconds").minus(before)
    assert delta.count == 50
    assert delta.quantile(0.5) == pytest.approx(0.0075)


def test_quantile_in_the_overflow_bucket_reports_the_last_bound_as_a_lower_limit() -> None:
    h = metrics.histogram(PAGE, "x_seconds", lambda labels: labels["verb"] == "bind")
    assert h.quantile(0.99) == 0.01
    assert h.overflows(0.99)
    summary = metrics.summarize(h)
    assert summary["p99_beyond_last_bucket"] is True
    assert summary["p99_bucket_ms"] == [10.0, None]
    json.dumps(summary, allow_nan=False)
    assert not metrics.histogram(PAGE, "x_seconds").overflows(0.5)


def test_gauges_and_label_values_are_read() -> None:
    assert metrics.counter(PAGE, "scheduler_cache_size", lambda lb: lb["type"] == "nodes") == 1000
    assert metrics.label_values(PAGE, "x_seconds", "verb") == ["filter", "bind"]
    assert metrics.histogram(PAGE, "absent_seconds").quantile(0.5) is None


def _extension_point_page() -> str:
    """kube-scheduler's extension-point histogram: the stock profile's Bind and Filter."""
    name = "scheduler_framework_extension_point_duration_seconds"
    lines = [f"# TYPE {name} histogram"]
    for point, buckets, total in (
        ("Bind", (("0.004", 80), ("0.016", 99), ("+Inf", 100)), 0.4),
        ("Filter", (("+Inf", 500),), 0.1),
    ):
        labels = f'extension_point="{point}",profile="default-scheduler",status="Success"'
        lines += [f'{name}_bucket{{{labels},le="{le}"}} {n}' for le, n in buckets]
        lines += [f"{name}_sum{{{labels}}} {total}", f"{name}_count{{{labels}}} {buckets[-1][1]}"]
    return "\n".join(lines) + "\n"


SCHEDULER_PAGE = _extension_point_page()


def test_the_stock_schedulers_own_binding_is_read_as_the_bind_reference() -> None:
    """The stock scheduler's Bind extension point (its Binding POST) is what a bind costs at
    that API server load; gpushare-scheduler has none (the extender binds)."""
    stock = scheduler_summary("", SCHEDULER_PAGE, profile="default-scheduler")
    assert stock["bind_plugins"]["count"] == 100
    assert stock["bind_plugins"]["p99_bucket_ms"] == [4.0, 16.0]
    gpushare = scheduler_summary("", SCHEDULER_PAGE, profile="gpushare-scheduler")
    assert gpushare["bind_plugins"]["count"] == 0


# ---- phase timing ---------------------------------------------------------------------------


def test_phase_rate_counts_from_first_post_to_last_bind() -> None:
    t = PhaseTiming(total=4)
    t.created = {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4}
    t.bound = {"a": 0.5, "b": 0.9, "c": 1.5, "d": 2.0}
    s = t.summary()
    assert s["pods_per_s"] == 2.0
    assert s["creation_pods_per_s"] == 10.0
    assert s["bind_latency_ms"]["max"] == 1600.0
    json.dumps(s)  # results are written as JSON


def test_steady_rate_ignores_start_and_tail() -> None:
    times = [0.0] * 10 + [10.0 + i * 0.01 for i in range(80)] + [100.0] * 10
    assert steady_rate(times) == pytest.approx(80 / 0.8, rel=0.02)


# ---- several runs in one results file ------------------------------------------------------


def _run_result(
    *, label: str | None, seconds_per_pod: float, dedicated: bool = False, options: Any = None
) -> Any:
    """A result as bench.scale.run assembles it: two pods per phase bound at the given pace."""
    opts = options or parse_args(["--nodes", "2", "--pods", "2", "--stock-pods", "2"])
    filter_page = PAGE

    def phase(extender: bool) -> dict[str, Any]:
        t = PhaseTiming(total=2)
        t.created = {"a": 0.001, "b": 0.002}
        t.bound = {"a": seconds_per_pod, "b": 2 * seconds_per_pod}
        out = t.summary()
        out["scheduler"] = {"attempts_by_result": {"scheduled": 2, "error": 0}}
        out["cpu_cores_used"] = {"bench": 0.1}
        if extender:
            h = metrics.histogram(filter_page, "x_seconds", lambda lb: lb["verb"] == "filter")
            out["extender_latency"] = {"filter": metrics.summarize(h)}
        return out

    return assemble(
        opts,
        machine=machine_description(shared_host=not dedicated, label=label),
        started=datetime(2026, 1, 1, tzinfo=UTC),
        version={"gitVersion": "v1.34.4"},
        nodes_s=1.0,
        phases={"stock": phase(False), "extender": phase(True)},
        invariant=check([], []).summary(),
        source={"git_head": "abc1234"},
    )


def test_combined_results_keep_the_primary_run_on_top_and_every_run_labelled() -> None:
    quiet = _run_result(label="16-core machine", seconds_per_pod=0.005, dedicated=True)
    busy = _run_result(label=None, seconds_per_pod=0.02)
    combined = combine(quiet, {"runs": [busy]})
    # The issue's fields stay where readers look for them, from the primary run.
    for key in ("nodes", "pods", "extender_pods_per_s", "stock_pods_per_s", "extender_p99_ms"):
        assert combined[key] == quiet[key]
    assert combined["extender_pods_per_s"] == 200.0
    assert combined["machine"]["shared_host"] is False
    assert combined["primary_run"] == "16-core machine"
    assert [r["extender_pods_per_s"] for r in combined["runs"]] == [200.0, 50.0]
    json.dumps(combined, allow_nan=False)
    # Combining again (e.g. with a third run) keeps the earlier runs.
    third = _run_result(label="third", seconds_per_pod=0.01)
    again = combine(third, combined)
    assert [label_of(r) for r in again["runs"]][:2] == ["third", "16-core machine"]
    assert len(again["runs"]) == 3


def test_runs_that_cannot_be_told_apart_are_refused_with_the_fix() -> None:
    a = _run_result(label="same", seconds_per_pod=0.01)
    with pytest.raises(InvalidInputError) as err:
        combine(a, copy.deepcopy(a))
    assert "FILE.json=LABEL" in str(err.value)


def test_combined_markdown_compares_the_machines_then_details_each() -> None:
    quiet = _run_result(label="16-core machine", seconds_per_pod=0.005, dedicated=True)
    busy = _run_result(label="2-core VM", seconds_per_pod=0.02)
    md = render_markdown(combine(quiet, busy))
    table = [ln for ln in md.splitlines() if ln.startswith("| 16-core machine |")]
    assert len(table) == 1 and "| 200.0 |" in table[0] and "dedicated" in table[0]
    assert any(ln.startswith("| 2-core VM |") and "| 50.0 |" in ln for ln in md.splitlines())
    assert "## Run: 16-core machine" in md and "## Run: 2-core VM" in md
    assert "### Phases" in md
    single = render_markdown(busy)
    assert "2-core VM: " in single and "shared host" in single


def test_each_run_reports_issue_47s_fields_per_mode_and_the_controllers_peak_memory() -> None:
    """The results carry, per run and mode, what issue 47 asks for (nodes, pods, policy, mode,
    pods/s against the stock scheduler's, filter and bind p99, controller RSS, violations,
    machine); a run without a memory reading fails the RSS target rather than passing it."""
    quiet = _run_result(label="16-core machine", seconds_per_pod=0.005, dedicated=True)
    for key in ("nodes", "pods", "policy", "mode", "pods_per_s", "stock_pods_per_s"):
        assert key in quiet
    assert (quiet["policy"], quiet["mode"]) == ("gpushare", "extender")
    assert quiet["controller_rss_mib"] is None
    assert quiet["targets"]["controller_rss_mib <= 2048"] is False
    combined = combine(quiet, _run_result(label="2-core VM", seconds_per_pod=0.02))
    lines = combined["by_mode"]
    assert [(m["machine"], m["mode"], m["pods_per_s"]) for m in lines] == [
        ("16-core machine", "extender", 200.0),
        ("2-core VM", "extender", 50.0),
    ]
    assert set(lines[0]) == {
        "nodes", "pods", "policy", "mode", "pods_per_s", "stock_pods_per_s", "filter_p99_ms",
        "bind_p99_ms", "controller_rss_mib", "violations", "machine",
    }  # fmt: skip
    assert "By mode" in render_markdown(combined)


def test_memory_of_a_process_is_read_from_proc_in_mib() -> None:
    mine = harness.memory_mib(os.getpid())
    assert mine is not None and 0 < mine["rss"] <= mine["peak"]
    assert harness.memory_mib(2**22 + 12345) is None  # no such process


def test_controller_samples_go_to_one_file_per_phase_the_controller_places() -> None:
    """--sample-controller FILE: the extender phase's samples in FILE, the DRA phase the
    controller places beside it, no sampler for phases it does not place."""
    base = Path("/out/ctl.speedscope.json")
    assert _sample_file(base, "extender") == base
    assert _sample_file(base, "dra-gpushare") == Path("/out/ctl.speedscope.dra-gpushare.json")
    assert _sample_file(base, "stock") is None and _sample_file(None, "extender") is None


# ---- the protocol floor ----------------------------------------------------------------------


def test_protocol_floor_offers_the_first_node_holds_nothing_and_binds_without_gpus() -> None:
    flow = scale_flow.build(3, 8, 0.0, scale_flow.synthetic_tasks(4, 1), 1)
    floored = FloorExtender(view=flow.view, writer=flow.writer, policy=flow.extender.policy)
    pod = scale_flow._stamp(
        fractional_pod(0, scale_flow.synthetic_tasks(1, 2)[0], namespace="bench"), "uid-f0"
    )
    pod["status"] = {"phase": "Pending"}
    flow.view.upsert_pod(pod)
    name = pod["metadata"]["name"]
    offered = list(reversed(flow.names))
    answer = floored.filter(parse_extender_args({"Pod": pod, "NodeNames": offered}))
    assert answer["NodeNames"] == [offered[0]]
    assert answer["FailedNodes"] == {} and answer["Error"] == ""
    assert flow.view.reservation(f"bench/{name}") is None  # nothing held
    bound = asyncio.run(
        floored.bind(
            parse_binding_args(
                {"PodName": name, "PodNamespace": "bench", "PodUID": "uid-f0", "Node": offered[0]}
            )
        )
    )
    assert bound == {"Error": ""}
    assert flow.writer.bound[f"bench/{name}"] == (offered[0], {})  # no GPU, no annotation
    assert flow.view.reservation(f"bench/{name}") is None


def test_protocol_floor_takes_the_place_of_the_extender_the_controller_builds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(vars(controller), "Extender", vars(controller)["Extender"])
    floor.install()
    assert controller._extender.__globals__["Extender"] is FloorExtender


@pytest.mark.parametrize("other", [["--dra"], ["--stock-only"], ["--controller-source", "x"]])
def test_protocol_floor_is_refused_beside_options_it_cannot_mean(other: list[str]) -> None:
    with pytest.raises(InvalidInputError, match="--protocol-floor") as err:
        parse_args(["--nodes", "2", "--pods", "2", "--protocol-floor", *other])
    assert other[0] in str(err.value)


def test_protocol_floor_runs_are_labelled_as_such() -> None:
    opts = parse_args(["--nodes", "2", "--pods", "2", "--stock-pods", "2", "--protocol-floor"])
    assert opts.protocol_floor
    result = _run_result(label=None, seconds_per_pod=0.01, options=opts)
    assert result["setup"]["controller_source"].startswith("protocol floor")
