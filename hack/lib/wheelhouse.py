#!/usr/bin/env python3
"""Make an offline wheelhouse from the distributions installed in this Python environment.

hack/build-image.sh builds the project's Dockerfile with no access to a package index. The
Dockerfile's `pip` steps then read wheels from a directory instead; this script fills it by
repacking installed distributions (their RECORD lists every file) into `.whl` files. Same
names, versions, files and tags as installed here, so not byte-identical to the index's wheels:
scripts outside site-packages are left out (pip recreates console scripts from
entry_points.txt) and the installer's own files (INSTALLER, RECORD, REQUESTED,
direct_url.json) are rewritten or dropped.

Run it with the interpreter whose site-packages should be packed (the project's .venv):

    .venv/bin/python hack/lib/wheelhouse.py --out DIR --project pyproject.toml [--add setuptools]

It packs the runtime dependency closure of the project's `[project] dependencies` (markers
evaluated for this interpreter; the project itself is not packed, the Dockerfile builds it
from source) plus every `--add` distribution.
"""

import argparse
import base64
import csv
import hashlib
import io
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

INSTALLER_FILES = {"INSTALLER", "RECORD", "REQUESTED", "direct_url.json"}


def _dist(name: str) -> metadata.Distribution:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        sys.exit(f"wheelhouse: {name!r} is not installed in {sys.prefix}; run `make venv` first")


def _wanted(texts: list[str], extras: frozenset[str] = frozenset()) -> list[Requirement]:
    """The requirements that apply to this interpreter with these extras selected."""
    wanted = []
    for text in texts:
        req = Requirement(text)
        if req.marker is None or any(
            req.marker.evaluate({"extra": extra}) for extra in ("", *sorted(extras))
        ):
            wanted.append(req)
    return wanted


def closure(roots: list[Requirement]) -> dict[str, metadata.Distribution]:
    """The roots and every distribution they need at runtime, following requested extras."""
    found: dict[str, metadata.Distribution] = {}
    done: set[tuple[str, frozenset[str]]] = set()
    todo = list(roots)
    while todo:
        req = todo.pop()
        key = canonicalize_name(req.name)
        extras = frozenset(canonicalize_name(e) for e in req.extras)
        if (key, extras) in done:
            continue
        done.add((key, extras))
        dist = found.get(key) or _dist(req.name)
        found[key] = dist
        todo += _wanted(dist.requires or [], extras)
    return found


def _tags(wheel_meta: str) -> str:
    """The compressed tag of a wheel file name from the Tag: lines of a WHEEL file."""
    pys: list[str] = []
    abis: list[str] = []
    plats: list[str] = []
    for line in wheel_meta.splitlines():
        if line.startswith("Tag:"):
            py, abi, plat = line.split(":", 1)[1].strip().split("-")
            for seen, value in ((pys, py), (abis, abi), (plats, plat)):
                if value not in seen:
                    seen.append(value)
    if not pys:
        return "py3-none-any"
    return "-".join(".".join(part) for part in (pys, abis, plats))


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(dist: metadata.Distribution, out: Path) -> Path:
    """Write one installed distribution back as a wheel in ``out``."""
    files = dist.files
    if files is None:
        sys.exit(f"wheelhouse: {dist.metadata['Name']} has no RECORD; cannot repack it")
    info_dir = next((f.parts[0] for f in files if f.parts[0].endswith(".dist-info")), None)
    if info_dir is None:
        sys.exit(f"wheelhouse: {dist.metadata['Name']} is not installed from a wheel")
    wheel_meta = dist.read_text("WHEEL") or ""
    name = canonicalize_name(dist.metadata["Name"]).replace("-", "_")
    target = out / f"{name}-{dist.version}-{_tags(wheel_meta)}.whl"
    record: list[tuple[str, str, str]] = []
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as whl:
        for rel in sorted(files, key=str):
            arcname = rel.as_posix()
            if arcname.startswith("..") or "__pycache__" in rel.parts:
                continue
            if rel.parts[0] == info_dir and rel.name in INSTALLER_FILES:
                continue
            src = Path(str(dist.locate_file(rel)))
            if not src.is_file():
                continue
            data = src.read_bytes()
            zinfo = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
            zinfo.external_attr = (src.stat().st_mode & 0o777 | 0o100000) << 16
            zinfo.compress_type = zipfile.ZIP_DEFLATED
            whl.writestr(zinfo, data)
            record.append((arcname, _digest(data), str(len(data))))
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerows(record)
        writer.writerow((f"{info_dir}/RECORD", "", ""))
        whl.writestr(f"{info_dir}/RECORD", buf.getvalue())
    return target


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="directory to fill")
    parser.add_argument("--project", type=Path, help="pyproject.toml whose dependencies to pack")
    parser.add_argument("--add", action="append", default=[], metavar="DIST")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    roots = [Requirement(name) for name in args.add]
    if args.project is not None:
        project = tomllib.loads(args.project.read_text())["project"]
        roots += _wanted(project.get("dependencies", []))
    dists = closure(roots)
    for old in args.out.glob("*.whl"):
        old.unlink()
    for key in sorted(dists):
        path = repack(dists[key], args.out)
        print(f"wheelhouse: {path.name}", file=sys.stderr)
    print(f"wheelhouse: {len(dists)} wheels in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
