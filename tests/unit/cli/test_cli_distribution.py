"""The CLI-only distribution ``kubectl-gpushare`` (hack/cli_wheel.py, ``make cli-wheel``) as a
user installs it (#46): into a fresh virtual environment with pip and no package index, so a
dependency would fail the install; at most 15 MB, nothing compiled, none of grpc, protobuf,
kopf or cryptography; an import name of its own, so the unrelated ``gpushare`` project of the
package index installs beside it without sharing a file; and the installed command reads a
cluster (the API server stand-in, a multi-file KUBECONFIG) like the development install does.
"""

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests import REPO
from tests.fixtures.builders import GPU_A, NODES
from tests.fixtures.builders import placed_pod as pod
from tests.fixtures.fake_apiserver import FakeApiServer, kubectl_binary, split_kubeconfig

MAX_INSTALLED_BYTES = 15 * 2**20
FORBIDDEN = ("grpc", "google", "kopf", "cryptography", "lightkube", "yaml", "aiohttp")

spec = importlib.util.spec_from_file_location("cli_wheel", REPO / "hack" / "cli_wheel.py")
assert spec is not None and spec.loader is not None
cli_wheel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cli_wheel)


def unrelated_gpushare_wheel(directory: Path) -> Path:
    """A stand-in for the package index's unrelated ``gpushare``: same import name as ours."""
    wheel = directory / "gpushare-9.9.9-py3-none-any.whl"
    info = "gpushare-9.9.9.dist-info"
    files = {
        "gpushare/__init__.py": b"SOMEONE_ELSE = True\n",
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: gpushare\nVersion: 9.9.9\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"]).encode()
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


def test_the_wheel_is_small_pure_and_under_its_own_import_name(tmp_path: Path) -> None:
    wheel = cli_wheel.build(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith("/METADATA"))).decode()
        size = sum(i.file_size for i in archive.infolist())
    assert {n.split("/")[0] for n in names} == {
        "kubectl_gpushare",
        "kubectl_gpushare-0.1.0.dist-info",
    }
    assert not [n for n in names if n.endswith((".so", ".pyd", ".dylib"))]
    assert "Requires-Dist" not in metadata
    assert size < MAX_INSTALLED_BYTES
    # Built twice, the same bytes (a release artefact that can be checked).
    assert cli_wheel.build(tmp_path / "again").read_bytes() == wheel.read_bytes()


def test_installed_alone_beside_the_unrelated_gpushare_it_reads_the_cluster(
    tmp_path: Path,
) -> None:
    kubectl = kubectl_binary()
    if kubectl is None:
        pytest.skip("kubectl not found: hack/build-tools.sh kube builds it")
    wheel = cli_wheel.build(tmp_path / "dist")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    # No index: a declared dependency would make this fail.
    for package in (wheel, unrelated_gpushare_wheel(tmp_path)):
        done = subprocess.run(
            [*pip, "install", "--no-index", str(package)],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    site = next((venv / "lib").glob("python3*/site-packages"))
    ours = [p for p in site.rglob("*") if p.is_file() and "kubectl_gpushare" in str(p)]
    assert sum(p.stat().st_size for p in ours) < MAX_INSTALLED_BYTES
    installed = {p.name.split("-")[0].lower() for p in site.iterdir()}
    assert not installed & set(FORBIDDEN), installed
    # Both import names resolve to their own package.
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import gpushare, kubectl_gpushare as k; print(gpushare.SOMEONE_ELSE, k.__version__)"
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path, env=clean,
    )  # fmt: skip
    assert probe.stdout.split() == ["True", "0.1.0"], probe.stderr

    pods = [pod("ml", "a", GPU_A, "0.25", 25)]
    server = FakeApiServer(
        {"/api/v1/nodes": [dict(n) for n in NODES], "/api/v1/namespaces/ml/pods": pods}
    )
    try:
        env = {**clean, "KUBECTL": kubectl, "KUBECONFIG": split_kubeconfig(tmp_path, server.url)}
        command = str(venv / "bin" / "kubectl-gpushare")
        version = subprocess.run(
            [command, "--version"],
            capture_output=True, text=True, env=env, timeout=60, check=False, cwd=tmp_path,
        )  # fmt: skip
        assert version.stdout.strip() == "kubectl gpushare 0.1.0", version.stderr
        got = subprocess.run(
            [command, "get", "pods", "-o", "custom-columns=POD:.name,GPU:.gpus[*].uuid"],
            capture_output=True, text=True, env=env, timeout=60, check=False, cwd=tmp_path,
        )  # fmt: skip
        assert got.returncode == 0, got.stderr
        assert [line.split() for line in got.stdout.splitlines()] == [["POD", "GPU"], ["a", GPU_A]]
    finally:
        server.close()
