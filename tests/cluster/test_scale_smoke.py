"""The scale bench in its small mode, end to end: its own control plane with KWOK nodes, the real
kube-scheduler twice (stock and gpushare-scheduler), the real controller's extender, then the
same pods as ResourceClaims (``--dra``), placed by kube-scheduler's DRA allocator and by the
controller (gpushare placement of gated pods); every pod bound and
every GPU within its limits afterwards.

Speeds are not asserted here (bench/results/scale.* holds them): only that the bench produces a
complete, correct result a user can rely on.
"""

import csv
import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from bench.scale.harness import DEFAULT_STATE_DIR, REPO, control_plane_running
from bench.scale.run import DEFAULT_TRACES
from bench.scale.workload import DEFAULT_TRACE_FILE

pytestmark = [pytest.mark.cluster, pytest.mark.own_control_plane]


def traces_dir(tmp: Path) -> Path:
    """The openb traces when this checkout sits beside them (they are never committed), else a
    small pod list in their format: fractional and whole-GPU tasks, the shapes the bench reads."""
    if (DEFAULT_TRACES / DEFAULT_TRACE_FILE).is_file():
        return DEFAULT_TRACES
    rng = random.Random(7)
    with (tmp / DEFAULT_TRACE_FILE).open("w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(
            ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "qos", "creation_time"]
        )
        for i in range(600):
            milli = rng.choice([1000, 810, 650, 470, 460, 320, 230, 100, 50])
            qos = rng.choice(["LS", "BE"])
            out.writerow([f"pod-{i:04d}", rng.choice([2000, 4000, 8000]), 8192, 1, milli, qos, i])
    return tmp


def _controller_present() -> bool:
    return importlib.util.find_spec("gpushare.cluster.__main__") is not None


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[type-arg]
    if os.geteuid() != 0:
        pytest.skip("the scale harness needs root for its state dir under /var/lib")
    if not _controller_present():
        pytest.skip("gpushare.cluster has no __main__ yet: there is no extender to measure")
    if control_plane_running(DEFAULT_STATE_DIR):
        pytest.skip("a scale bench is running on this machine (hack/kwok-cluster.sh status)")
    out = tmp_path_factory.mktemp("scale")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.scale.run",
            "--small",
            "--dra",
            "--out",
            str(out / "scale"),
            "--logs",
            str(out / "logs"),
            "--traces",
            str(traces_dir(out)),
            "--stall-timeout",
            "60",
            "--timeout",
            "300",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"bench.scale.run --small failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    result: dict = json.loads((out / "scale.json").read_text())  # type: ignore[type-arg]
    result["_markdown"] = (out / "scale.md").read_text()
    return result


def test_every_fractional_pod_is_bound_by_the_extender(small_run: dict) -> None:  # type: ignore[type-arg]
    ext = small_run["phases"]["extender"]
    assert small_run["nodes"] == 20
    assert small_run["pods"] == 200
    assert ext["bound"] == 200, ext
    assert ext["create_errors"] == 0
    assert small_run["extender_pods_per_s"] > 0
    # The extender answered the scheduler for every pod: filter and bind were called.
    calls = {verb: s["count"] for verb, s in ext["extender_latency"].items()}
    assert calls.get("filter", 0) >= 200, calls
    assert calls.get("bind", 0) >= 200, calls


def test_no_gpu_is_oversubscribed_after_the_run(small_run: dict) -> None:  # type: ignore[type-arg]
    inv = small_run["invariant"]
    assert inv["violations"] == 0, inv["violation_examples"]
    assert inv["pods_placed"] == 200
    assert inv["gpus"] == 160
    assert 0 < inv["max_guaranteed_percent_on_a_gpu"] <= 100
    assert inv["max_pods_on_a_gpu"] <= 48


def test_stock_scheduler_reference_ran_on_the_same_nodes(small_run: dict) -> None:  # type: ignore[type-arg]
    stock = small_run["phases"]["stock"]
    assert stock["bound"] == stock["pods"] == small_run["stock_pods"] == 120
    assert small_run["stock_pods_per_s"] > 0
    assert small_run["ratio_to_stock"] is not None
    assert stock["scheduler"]["attempts_by_result"]["scheduled"] >= 120


def test_scheduler_sli_histograms_were_scraped(small_run: dict) -> None:  # type: ignore[type-arg]
    for phase in ("stock", "extender"):
        sli = small_run["phases"][phase]["scheduler"]["pod_scheduling_sli"]
        assert sli["count"] >= small_run["phases"][phase]["pods"]
        assert sli["p99_ms"] is not None


def test_the_controllers_event_loop_is_measured(small_run: dict) -> None:  # type: ignore[type-arg]
    """The real controller serves its loop's turns on /metrics and the bench reads them: how
    busy its one thread was while it placed the phase's pods, and how long a request waited."""
    loop = small_run["phases"]["extender"]["controller_loop"]
    assert loop["turns"] > small_run["phases"]["extender"]["pods"]  # at least a turn per call
    assert 0 < loop["busy_share"] <= 1.0
    assert loop["mean_wait_for_turn_ms"] > 0
    assert "The controller's event loop" in small_run["_markdown"]


def test_results_are_written_for_people_too(small_run: dict) -> None:  # type: ignore[type-arg]
    md = small_run["_markdown"]
    assert "Scheduling throughput at scale" in md
    assert "invariant violations" in md
    assert small_run["machine"]["cpu_cores"] >= 1
    assert small_run["date"].endswith("Z")


def test_no_gpu_is_handed_out_beyond_its_capacity_as_claims(small_run: dict) -> None:  # type: ignore[type-arg]
    """Both DRA phases: claims placed by the controller (gated pods, what mode dra installs)
    and by kube-scheduler's allocator."""
    for key, who in (("dra_gpushare", "gpushare placement"), ("dra", "kube-scheduler's allocator")):
        dra = small_run["phases"][key]
        assert dra["pods"] == dra["created"] == 200, dra
        allocated = small_run["invariant"][key]
        assert allocated["violations"] == 0, allocated["violation_examples"]
        assert allocated["claims_allocated"] == dra["bound"] > 0
        assert 0 < allocated["gpus_used"] <= 160
        assert f"ratio DRA ({who}) / extender" in small_run["_markdown"]


def test_every_claim_is_allocated(small_run: dict) -> None:  # type: ignore[type-arg]
    """On v1.34.4 only the first GPU of each node took claims (kubernetes/kubernetes#133705),
    so the DRA phase runs the DRA mode's release, DRA_KUBE_VERSION (docs/dra.md)."""
    for key in ("dra", "dra_gpushare"):
        assert small_run["phases"][key]["bound"] == 200
        assert small_run["invariant"][key]["claims_allocated"] == 200
    assert small_run["setup"]["kubernetes"] != "v1.34.4"
