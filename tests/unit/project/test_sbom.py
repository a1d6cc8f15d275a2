"""The release image's SBOM (hack/sbom.py, issue #66): read out of an OCI archive shaped as
buildah writes one (an index, a manifest, gzipped layers), it lists what the last layer leaves
installed: Debian packages from the dpkg database and Python distributions from site-packages,
each with its package URL, contained in the image named by its digest; the same archive gives
the same bytes."""

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

from tests import REPO
from tests.fixtures.scripts import load_script

STATUS = b"""Package: libc6
Status: install ok installed
Architecture: amd64
Version: 2.36-9+deb12u13

Package: removed-one
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: ca-certificates
Status: install ok installed
Architecture: all
Version: 20230311+deb12u1
"""
SITE = "usr/local/lib/python3.11/site-packages"


def sbom_script() -> ModuleType:
    return load_script(REPO / "hack" / "sbom.py", "sbom")


def _tar(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(out.getvalue(), mtime=0)


def oci_archive(path: Path, layers: list[dict[str, bytes]]) -> str:
    blobs: dict[str, bytes] = {}

    def add(data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return digest

    layer_refs = [{"digest": add(_tar(files)), "size": 0} for files in layers]
    manifest = json.dumps(
        {"schemaVersion": 2, "config": {"digest": add(b"{}")}, "layers": layer_refs}
    ).encode()
    manifest_digest = add(manifest)
    index = json.dumps({"schemaVersion": 2, "manifests": [{"digest": manifest_digest}]}).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in [("index.json", index)] + [
            (f"blobs/sha256/{d.partition(':')[2]}", b) for d, b in blobs.items()
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return manifest_digest


def meta(name: str, version: str, licence: str = "") -> bytes:
    extra = f"License-Expression: {licence}\n" if licence else ""
    return f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n{extra}\n".encode()


def test_the_sbom_lists_what_the_image_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1800000000")
    archive = tmp_path / "image.oci.tar"
    digest = oci_archive(
        archive,
        [
            {
                "var/lib/dpkg/status": STATUS,
                f"{SITE}/pip-24.0.dist-info/METADATA": meta("pip", "24.0"),
                f"{SITE}/old_thing-1.0.dist-info/METADATA": meta("old_thing", "1.0"),
            },
            {
                f"{SITE}/kube_gpushare-0.1.0.dist-info/METADATA": meta(
                    "kube-gpushare", "0.1.0", "Apache-2.0"
                ),
                f"{SITE}/grpcio-1.85.1.dist-info/METADATA": meta("grpcio", "1.85.1"),
                f"{SITE}/.wh.old_thing-1.0.dist-info": b"",  # removed by the later layer
            },
        ],
    )
    script = sbom_script()
    doc = script.sbom(archive, version="0.1.0")
    assert doc["spdxVersion"] == "SPDX-2.3" and doc["dataLicense"] == "CC0-1.0"
    assert doc["creationInfo"]["created"] == "2027-01-15T08:00:00Z"
    image, *contents = doc["packages"]
    assert image["checksums"] == [{"algorithm": "SHA256", "checksumValue": digest[7:]}]
    purls = {p["externalRefs"][0]["referenceLocator"] for p in contents}
    assert purls == {
        "pkg:deb/debian/libc6@2.36-9+deb12u13?arch=amd64",
        "pkg:deb/debian/ca-certificates@20230311+deb12u1?arch=all",
        "pkg:pypi/pip@24.0",
        "pkg:pypi/kube-gpushare@0.1.0",
        "pkg:pypi/grpcio@1.85.1",
    }
    licences = {p["name"]: p["licenseDeclared"] for p in contents}
    assert licences["kube-gpushare"] == "Apache-2.0" and licences["grpcio"] == "NOASSERTION"
    contained = {r["relatedSpdxElement"] for r in doc["relationships"][1:]}
    assert contained == {p["SPDXID"] for p in contents} and len(contained) == 5
    assert doc["relationships"][0]["relationshipType"] == "DESCRIBES"
    # Same archive, same bytes.
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    for out in (first, second):
        out.write_text(json.dumps(script.sbom(archive, version="0.1.0"), indent=2, sort_keys=True))
    assert first.read_bytes() == second.read_bytes()


def test_make_release_writes_the_sbom_beside_the_image() -> None:
    release = (REPO / "hack" / "release.sh").read_text()
    assert "hack/sbom.py --image" in release and ".spdx.json" in release
