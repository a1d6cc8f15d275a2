"""``helm package`` the chart, byte for byte the same from the same sources (``make release``).

``helm package`` stamps every entry of the archive with the time it ran, so two runs differ. This
runs it, then writes the archive again with the same entries in the same order and everything
else fixed: each entry's time is SOURCE_DATE_EPOCH (else the time of the last commit that
touched the chart, else 0), owner 0:0 with no names, and the gzip header carries no time or
file name. What Helm reads (names, modes, contents) is what ``helm package`` wrote.
"""

import argparse
import gzip
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "gpushare"


def source_date(chart: Path) -> int:
    """SOURCE_DATE_EPOCH, else the last commit of the chart's directory, else 0."""
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return int(os.environ["SOURCE_DATE_EPOCH"])
    proc = subprocess.run(
        ["git", "log", "-1", "--format=%ct", "--", str(chart)],
        cwd=chart,
        capture_output=True,
        text=True,
        check=False,
    )
    out = proc.stdout.strip()
    return int(out) if proc.returncode == 0 and out.isdigit() else 0


def normalized(archive: bytes, *, mtime: int) -> bytes:
    """The same tar entries, in the same order, with fixed times and owners, gzipped without
    a time or name in the header."""
    tar_out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as src,
        tarfile.open(fileobj=tar_out, mode="w", format=tarfile.PAX_FORMAT) as dst,
    ):
        for member in src.getmembers():
            data = src.extractfile(member) if member.isfile() else None
            member.mtime = mtime
            member.uid = member.gid = 0
            member.uname = member.gname = ""
            member.pax_headers = {}
            dst.addfile(member, data)
    gz_out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=gz_out, compresslevel=9, mtime=0) as gz:
        gz.write(tar_out.getvalue())
    return gz_out.getvalue()


def package(helm: str, out_dir: Path, chart: Path = CHART) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [helm, "package", str(chart), "--destination", tmp],
            check=True,
            capture_output=True,
            text=True,
        )
        (made,) = Path(tmp).glob("*.tgz")
        out_dir.mkdir(parents=True, exist_ok=True)
        target = out_dir / made.name
        target.write_bytes(normalized(made.read_bytes(), mtime=source_date(chart)))
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--helm", default="helm", help="the helm binary")
    parser.add_argument("--out", type=Path, default=REPO / "dist")
    args = parser.parse_args()
    print(package(args.helm, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
