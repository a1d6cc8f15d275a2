#!/usr/bin/env python3
"""Write a single-layer container image as a docker-archive tarball, using only the stdlib.

The local cluster has no registry and no Docker engine, so its images (the pod sandbox
"pause" image, a busybox image for test pods) are assembled from local files and imported
with `ctr -n k8s.io images import`.

    image_archive.py --ref NAME:TAG --out image.tar --add SRC:DEST [--add ...]
                     [--symlink LINK:TARGET ...] [--entrypoint /bin/x] [--cmd sh]
"""

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile


def _parents(path: str) -> list[str]:
    parts = path.strip("/").split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"


def build_layer(adds: list[tuple[str, str]], links: list[tuple[str, str]]) -> bytes:
    buf = io.BytesIO()
    seen: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def ensure_dirs(dest: str) -> None:
            for d in _parents(dest):
                if d not in seen:
                    info = tarfile.TarInfo(d)
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tar.addfile(info)
                    seen.add(d)

        for d in ("tmp", "proc", "sys", "dev", "etc", "var/run"):
            ensure_dirs(d + "/x")
        for src, dest in adds:
            ensure_dirs(dest)
            info = tarfile.TarInfo(dest.strip("/"))
            data = open(src, "rb").read()  # noqa: SIM115 - tiny files, read once
            info.size = len(data)
            info.mode = os.stat(src).st_mode & 0o777
            tar.addfile(info, io.BytesIO(data))
        for link, target in links:
            ensure_dirs(link)
            info = tarfile.TarInfo(link.strip("/"))
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
        for name, text in (
            (
                "etc/passwd",
                PASSWD,
            ),
            ("etc/group", "root:x:0:\nnobody:x:65534:\n"),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(text)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(text.encode()))
    return buf.getvalue()


RAW = argparse.RawDescriptionHelpFormatter


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=RAW)
    parser.add_argument("--ref", required=True, help="image reference, e.g. example.org/pause:3.10")
    parser.add_argument("--out", required=True)
    parser.add_argument("--add", action="append", default=[], help="SRC:DEST file to copy in")
    parser.add_argument("--symlink", action="append", default=[], help="LINK:TARGET")
    parser.add_argument("--entrypoint", action="append", default=[])
    parser.add_argument("--cmd", action="append", default=[])
    args = parser.parse_args()
    adds = [tuple(a.split(":", 1)) for a in args.add]
    links = [tuple(s.split(":", 1)) for s in args.symlink]
    layer = build_layer(adds, links)  # type: ignore[arg-type]
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": args.entrypoint or None,
            "Cmd": args.cmd or None,
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "gpushare hack/lib/image_archive.py"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [args.ref], "Layers": ["layer.tar"]}]
    with open(args.out, "wb") as raw, tarfile.open(fileobj=raw, mode="w") as out:
        for name, data in (
            (config_name, config_bytes),
            ("layer.tar", layer),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            out.addfile(info, io.BytesIO(data))
    print(f"wrote {args.out} ({args.ref})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
