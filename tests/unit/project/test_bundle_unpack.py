"""Unpacking the GPU-host bundle (hack/lib/bundle.sh, shared by hack/gpu-host-e2e.sh and
hack/bundle-host-pytest.sh): the parts hack/gpu-host-bundle.sh writes are checked against their
SHA256SUMS and unpacked once; a damaged part is refused, naming the check, before anything is
unpacked; a bundle made for the other mode is refused, naming the flag that makes the right one.
And hack/bundle-host-pytest.sh refuses a call that names no bundle or no tests."""

import hashlib
import io
import lzma
import random
import subprocess
import tarfile
from pathlib import Path

from tests import REPO

LIB = REPO / "hack" / "lib" / "bundle.sh"
HOST_PYTEST = REPO / "hack" / "bundle-host-pytest.sh"


def make_bundle(out: Path, mode: str = "deviceplugin", chunk: int = 300) -> None:
    """A bundle as hack/gpu-host-bundle.sh lays it out: a tar.xz cut into parts, SHA256SUMS."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in {
            "BUNDLE": f"mode={mode} kubernetes=v1.34.4\n".encode(),
            "bin/kubelet": b"#!/bin/sh\n" + random.Random(0).randbytes(1000),
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    packed = lzma.compress(raw.getvalue())
    out.mkdir(parents=True)
    sums = []
    for i in range(0, len(packed), chunk):
        name = f"gpu-host-bundle.tar.xz.part-a{chr(ord('a') + i // chunk)}"
        (out / name).write_bytes(packed[i : i + chunk])
        sums.append(f"{hashlib.sha256(packed[i : i + chunk]).hexdigest()}  {name}\n")
    (out / "SHA256SUMS").write_text("".join(sums))


def unpack(
    bundle: Path, work: Path, mode: str = "deviceplugin"
) -> subprocess.CompletedProcess[str]:
    script = (
        'log() { echo "log: $*" >&2; }; die() { log "error: $*"; exit 1; }; '
        f'source "{LIB}"; B=$(bundle_unpack "$1" "$2"); bundle_env "$B" "$3"; '
        'echo "B=$B"; echo "KUBE=$GPUSHARE_KUBE_BIN"; echo "MODE=$GPUSHARE_CLUSTER_MODE"'
    )
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script, "unpack", str(bundle), str(work), mode],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_parts_are_checked_joined_and_unpacked_once(tmp_path: Path) -> None:
    make_bundle(tmp_path / "in")
    assert len(list((tmp_path / "in").glob("*.part-*"))) > 1
    first = unpack(tmp_path / "in", tmp_path / "work")
    assert first.returncode == 0, first.stderr
    bundle = tmp_path / "work" / "bundle"
    assert f"B={bundle}" in first.stdout
    assert f"KUBE={bundle}/bin" in first.stdout and "MODE=deviceplugin" in first.stdout
    assert (bundle / "bin" / "kubelet").read_bytes().startswith(b"#!/bin/sh")
    again = unpack(tmp_path / "in", tmp_path / "work")
    assert again.returncode == 0 and "already unpacked" in again.stderr


def test_a_damaged_part_is_refused_before_anything_is_unpacked(tmp_path: Path) -> None:
    make_bundle(tmp_path / "in")
    part = sorted((tmp_path / "in").glob("*.part-*"))[-1]
    part.write_bytes(part.read_bytes()[:-1] + b"\0")
    run = unpack(tmp_path / "in", tmp_path / "work")
    assert run.returncode != 0
    assert "damaged (sha256sum -c failed" in run.stderr
    assert not (tmp_path / "work" / "bundle").exists()


def test_a_bundle_of_the_other_mode_is_refused_naming_the_flag(tmp_path: Path) -> None:
    make_bundle(tmp_path / "in", mode="deviceplugin")
    run = unpack(tmp_path / "in", tmp_path / "work", mode="dra")
    assert run.returncode != 0
    assert "made for mode deviceplugin, not dra: hack/gpu-host-bundle.sh --mode dra" in run.stderr


def test_the_host_pytest_script_names_what_is_missing() -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(HOST_PYTEST), *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )

    assert "--bundle DIR is required" in run("--", "tests").stderr
    assert "unknown argument '-k'" in run("-k", "flood").stderr
    assert "Run cluster tests on another machine" in run("--help").stdout
