"""The release image's software bill of materials, read out of its OCI archive (``make release``;
docs/development.md, "Releasing").

Writes an SPDX 2.3 JSON document: the image (named by its manifest digest), every Debian package
its dpkg database lists as installed (``var/lib/dpkg/status``) and every Python distribution in
its site-packages (``*.dist-info/METADATA``: name, version, declared licence), each with its
package URL, all contained in the image. The layers are read in order, whiteouts applied, so
what a later layer removed is not listed. Standard library only and offline, as the rest of the
release; the same archive and SOURCE_DATE_EPOCH (else the commit time) give the same bytes.
"""

import argparse
import email.parser
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

REPO = Path(__file__).resolve().parents[1]
PROJECT_URL = "https://github.com/kube-gpushare/kube-gpushare"
DPKG_STATUS = "var/lib/dpkg/status"
METADATA = re.compile(
    r"^(usr/local|usr)/lib/python3[.\d]*/(site|dist)-packages/[^/]+\.dist-info/METADATA$"
)


def _blob(archive: tarfile.TarFile, digest: str) -> bytes:
    algorithm, _, value = digest.partition(":")
    member = archive.extractfile(f"blobs/{algorithm}/{value}")
    if member is None:
        raise SystemExit(f"the archive has no blob {digest}")
    return member.read()


def _manifest(archive: tarfile.TarFile) -> tuple[str, dict[str, object]]:
    """The image manifest's digest and body (the index's first manifest)."""
    index = json.loads(_blob_by_name(archive, "index.json"))
    digest = str(index["manifests"][0]["digest"])
    body = json.loads(_blob(archive, digest))
    if body.get("mediaType", "").endswith("image.index.v1+json") or "manifests" in body:
        digest = str(body["manifests"][0]["digest"])
        body = json.loads(_blob(archive, digest))
    return digest, body


def _blob_by_name(archive: tarfile.TarFile, name: str) -> bytes:
    member = archive.extractfile(name)
    if member is None:
        raise SystemExit(f"{name} missing: not an OCI archive")
    return member.read()


def image_files(path: Path) -> tuple[str, dict[str, bytes]]:
    """The manifest digest, and the files the SBOM reads as the image's last layer leaves them."""
    wanted: dict[str, bytes] = {}
    with tarfile.open(path) as archive:
        digest, manifest = _manifest(archive)
        for layer in manifest["layers"]:  # type: ignore[attr-defined]
            data = _blob(archive, layer["digest"])
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
                for member in tar:
                    name = member.name.removeprefix("./").lstrip("/")
                    base = PurePosixPath(name)
                    if base.name == ".wh..wh..opq":
                        prefix = f"{base.parent}/"
                        for known in [k for k in wanted if k.startswith(prefix)]:
                            del wanted[known]
                    elif base.name.startswith(".wh."):
                        gone = str(base.parent / base.name[4:])
                        for known in [k for k in wanted if k == gone or k.startswith(gone + "/")]:
                            del wanted[known]
                    elif member.isfile() and (name == DPKG_STATUS or METADATA.match(name)):
                        handle = tar.extractfile(member)
                        if handle is not None:
                            wanted[name] = handle.read()
    return digest, wanted


def debian_packages(status: bytes) -> Iterator[dict[str, str]]:
    for paragraph in status.decode(errors="replace").split("\n\n"):
        fields: dict[str, str] = {}
        for line in paragraph.splitlines():
            if line and not line[0].isspace() and ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields.get("Package") and fields.get("Status", "").endswith(" installed"):
            yield fields


def python_distributions(files: dict[str, bytes]) -> Iterator[dict[str, str]]:
    for name in sorted(files):
        if METADATA.match(name):
            meta = email.parser.BytesParser().parsebytes(files[name], headersonly=True)
            yield {
                "name": str(meta.get("Name", "")),
                "version": str(meta.get("Version", "")),
                "license": str(meta.get("License-Expression") or ""),
            }


def _spdx_id(kind: str, name: str, version: str) -> str:
    return "SPDXRef-" + re.sub(r"[^A-Za-z0-9.-]", "-", f"{kind}-{name}-{version}")


def source_date() -> str:
    if os.environ.get("SOURCE_DATE_EPOCH"):
        stamp = int(os.environ["SOURCE_DATE_EPOCH"])
    else:
        proc = subprocess.run(
            ["git", "log", "-1", "--format=%ct"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        stamp = int(proc.stdout.strip()) if proc.stdout.strip().isdigit() else 0
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _package(spdx_id: str, name: str, version: str, purl: str, licence: str) -> dict[str, object]:
    return {
        "SPDXID": spdx_id,
        "name": name,
        "versionInfo": version,
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": False,
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": licence or "NOASSERTION",
        "supplier": "NOASSERTION",
        "externalRefs": [
            {
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": purl,
            }
        ],
    }


def sbom(image: Path, *, version: str) -> dict[str, object]:
    digest, files = image_files(image)
    image_id = "SPDXRef-image"
    packages: list[dict[str, object]] = [
        {
            "SPDXID": image_id,
            "name": "gpushare",
            "versionInfo": version,
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": False,
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "Apache-2.0",
            "supplier": "NOASSERTION",
            "primaryPackagePurpose": "CONTAINER",
            "checksums": [{"algorithm": "SHA256", "checksumValue": digest.partition(":")[2]}],
            "externalRefs": [
                {
                    "referenceCategory": "PACKAGE-MANAGER",
                    "referenceType": "purl",
                    "referenceLocator": f"pkg:oci/gpushare@{digest.replace(':', '%3A')}",
                }
            ],
        }
    ]
    for deb in debian_packages(files.get(DPKG_STATUS, b"")):
        name, ver, arch = deb["Package"], deb.get("Version", ""), deb.get("Architecture", "")
        purl = f"pkg:deb/debian/{name}@{ver}" + (f"?arch={arch}" if arch else "")
        packages.append(_package(_spdx_id("deb", name, ver), name, ver, purl, ""))
    for dist in python_distributions(files):
        name, ver = dist["name"], dist["version"]
        purl = f"pkg:pypi/{re.sub(r'[-_.]+', '-', name).lower()}@{ver}"
        packages.append(_package(_spdx_id("pypi", name, ver), name, ver, purl, dist["license"]))
    packages[1:] = sorted(packages[1:], key=lambda p: str(p["SPDXID"]))
    relationships = [
        {
            "spdxElementId": "SPDXRef-DOCUMENT",
            "relationshipType": "DESCRIBES",
            "relatedSpdxElement": image_id,
        }
    ] + [
        {
            "spdxElementId": image_id,
            "relationshipType": "CONTAINS",
            "relatedSpdxElement": p["SPDXID"],
        }
        for p in packages[1:]
    ]
    return {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"gpushare-v{version} image",
        "documentNamespace": f"{PROJECT_URL}/releases/v{version}/sbom/{digest.replace(':', '-')}",
        "creationInfo": {"created": source_date(), "creators": ["Tool: gpushare-hack-sbom"]},
        "packages": packages,
        "relationships": relationships,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", type=Path, required=True, help="the image's OCI archive")
    parser.add_argument("--version", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    document = sbom(args.image, version=args.version)
    args.out.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    print(f"{args.out}: {len(document['packages']) - 1} packages")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
