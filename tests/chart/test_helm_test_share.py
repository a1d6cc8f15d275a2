"""`helm test`: the pod that checks a share of a GPU was placed and reached the container."""

import subprocess
from pathlib import Path
from typing import Any

from tests.fixtures.helm_chart import Chart

SHOW = "templates/tests/share.yaml"


def _pod(chart: Chart, values: dict[str, Any] | None = None) -> dict[str, Any]:
    return chart.render(values).get("Pod", "gpushare-test-share")


def _check(pod: dict[str, Any]) -> dict[str, Any]:
    (c,) = pod["spec"]["containers"]
    return c  # type: ignore[no-any-return]


def _run_check(pod: dict[str, Any], tmp_path: Path, annotations: str, env: dict[str, str]) -> str:
    """Run the pod's own script here, with its downward-API file and environment faked."""
    (tmp_path / "annotations").write_text(annotations)
    script = _check(pod)["command"][2].replace("/etc/podinfo", str(tmp_path))
    proc = subprocess.run(
        ["sh", "-c", script], env=env, capture_output=True, text=True, timeout=10, check=False
    )
    return f"rc={proc.returncode}\n{proc.stdout}{proc.stderr}"


def test_is_a_helm_test_hook_that_asks_for_a_share(chart: Chart) -> None:
    pod = chart.render({"tests": {"fraction": "0.25"}}).get("Pod", "gpushare-test-share")
    ann = pod["metadata"]["annotations"]
    assert ann["helm.sh/hook"] == "test"
    assert ann["gpushare.io/gpu-fraction"] == "0.25"
    assert "hook-succeeded" in ann["helm.sh/hook-delete-policy"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert _check(pod)["image"] == "gpushare/gpushare:0.1.0"
    assert not chart.render({"tests": {"enabled": False}}).all("Pod")


def test_check_passes_only_with_the_placed_gpu_and_a_big_enough_cap(
    chart: Chart, tmp_path: Path
) -> None:
    pod = _pod(chart)
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    placed = 'gpushare.io/gpu-uuid="GPU-1"\ngpushare.io/active-thread-percentage="10"\n'
    env = {
        "PATH": "/usr/bin:/bin",
        "CUDA_VISIBLE_DEVICES": "GPU-1",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10",
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
    }
    out = _run_check(pod, tmp_path, placed, env)
    assert out.startswith("rc=0") and "PASS" in out, out
    wrong_gpu = _run_check(pod, tmp_path, placed, {**env, "CUDA_VISIBLE_DEVICES": "GPU-2"})
    assert wrong_gpu.startswith("rc=1") and "not the placed GPU" in wrong_gpu
    unplaced = _run_check(pod, tmp_path, "", env)
    assert "did not place this pod" in unplaced
    low = 'gpushare.io/gpu-uuid="GPU-1"\ngpushare.io/active-thread-percentage="5"\n'
    capped = _run_check(pod, tmp_path, low, {**env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "5"})
    assert "below the 10% share" in capped
    no_pipe = _run_check(pod, tmp_path, placed, {**env, "CUDA_MPS_PIPE_DIRECTORY": "/nope"})
    assert "pipe directory is not mounted" in no_pipe


def test_fraction_is_validated(chart: Chart) -> None:
    assert "fraction" in chart.fails({"tests": {"fraction": "lots"}})
