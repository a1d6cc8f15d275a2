"""The krew manifest (deploy/krew/gpushare.yaml): generated from the archive the repository
builds (its sha256 is that archive's), shaped as krew reads it, and the executable inside is
the CLI itself (a Python zip application: nothing to pip install, issue #66)."""

import hashlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import yaml

import gpushare
from tests import REPO
from tests.fixtures.scripts import load_script

MANIFEST = REPO / "deploy" / "krew" / "gpushare.yaml"


def krew_script() -> ModuleType:
    return load_script(REPO / "hack" / "krew.py", "krew_release")


def test_the_manifest_is_what_make_krew_writes_from_a_fresh_archive(tmp_path: Path) -> None:
    """Same sources, same archive bytes, same manifest: a stale sha256 or version fails here
    (fix: make krew)."""
    krew = krew_script()
    archive = krew.build_archive(tmp_path, version=gpushare.__version__)
    assert (
        archive.read_bytes()
        == krew.build_archive(tmp_path / "again", version=gpushare.__version__).read_bytes()
    )
    assert MANIFEST.read_text() == krew.render_manifest(archive, version=gpushare.__version__)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    plugin = yaml.safe_load(MANIFEST.read_text())
    assert {p["sha256"] for p in plugin["spec"]["platforms"]} == {digest}


def test_the_manifest_has_the_fields_krew_requires() -> None:
    plugin = yaml.safe_load(MANIFEST.read_text())
    assert plugin["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert plugin["kind"] == "Plugin"
    assert plugin["metadata"]["name"] == "gpushare"
    spec = plugin["spec"]
    assert spec["version"] == f"v{gpushare.__version__}"
    assert spec["homepage"] == "https://github.com/kube-gpushare/kube-gpushare"
    assert spec["shortDescription"] and spec["description"] and spec["caveats"]
    assert "python3 >= 3.11" in spec["caveats"] and "pip install" not in spec["caveats"]
    seen = set()
    for platform in spec["platforms"]:
        labels = platform["selector"]["matchLabels"]
        seen.add((labels["os"], labels["arch"]))
        assert platform["uri"] == (
            "https://github.com/kube-gpushare/kube-gpushare/releases/download/"
            f"v{gpushare.__version__}/kubectl-gpushare_v{gpushare.__version__}.zip"
        )
        assert re.fullmatch(r"[0-9a-f]{64}", platform["sha256"])
        assert platform["bin"] == "kubectl-gpushare"
        assert {f["from"] for f in platform["files"]} == {"kubectl-gpushare", "LICENSE"}
    assert {"linux", "darwin"} == {os_name for os_name, _ in seen}
    assert len(seen) == len(spec["platforms"])


def test_the_archive_holds_an_executable_launcher(tmp_path: Path) -> None:
    archive = krew_script().build_archive(tmp_path, version=gpushare.__version__)
    with zipfile.ZipFile(archive) as z:
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in z.infolist()}
        z.extractall(tmp_path / "x")
    assert modes == {"kubectl-gpushare": 0o755, "LICENSE": 0o644}


def _unpacked(tmp_path: Path) -> Path:
    archive = krew_script().build_archive(tmp_path, version=gpushare.__version__)
    with zipfile.ZipFile(archive) as z:
        z.extractall(tmp_path / "x")
    plugin = tmp_path / "x" / "kubectl-gpushare"
    plugin.chmod(0o755)
    return plugin


def test_the_plugin_runs_the_cli_with_a_bare_python(tmp_path: Path) -> None:
    """No package installed: Python's isolated mode (no site-packages, no PYTHONPATH), from
    an empty directory, runs the CLI out of the zip application."""
    plugin = _unpacked(tmp_path)
    assert plugin.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(plugin) as z:
        names = z.namelist()
    assert "__main__.py" in names and "kubectl_gpushare/cli/main.py" in names
    assert not [n for n in names if not n.startswith("kubectl_gpushare/") and n != "__main__.py"]
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(empty)}
    ran = subprocess.run(
        [sys.executable, "-I", str(plugin), "--version"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == f"kubectl gpushare {gpushare.__version__}"
    # As krew runs it: by its shebang, with python3 from PATH.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    direct = subprocess.run(
        [str(plugin), "--version"],
        cwd=empty,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(empty)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert direct.returncode == 0 and gpushare.__version__ in direct.stdout, direct.stderr


def test_a_python_that_cannot_run_it_is_named(tmp_path: Path) -> None:
    plugin = _unpacked(tmp_path)
    env = {"PATH": os.environ["PATH"], "GPUSHARE_PYTHON": str(tmp_path / "no-such-python")}
    ran = subprocess.run(
        [sys.executable, "-I", str(plugin), "top"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 1
    assert "GPUSHARE_PYTHON" in ran.stderr and "no-such-python" in ran.stderr
