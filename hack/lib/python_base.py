#!/usr/bin/env python3
"""Assemble a local stand-in for the `python:3.11-slim-bookworm` base image, offline.

The project's Dockerfile starts FROM the official Python image. The CI machine has no Docker
engine and no registry access, so hack/build-image.sh builds the same Dockerfile with buildah
from a base image made here and tagged exactly as the FROM line. It is made the way the
official image is made, from what this Debian 12 host already has:

- the Debian part: every host package of priority `required` or `Essential: yes` (what
  `debian:bookworm-slim` holds), plus ca-certificates, netbase and tzdata, plus the packages
  owning the shared libraries the Python build links to, and their Depends/Pre-Depends;
  copied file by file from `dpkg -L`, documentation left out (as the slim image's dpkg
  excludes do), with the dpkg database for those packages;
- Python: the CPython that built the project's .venv (a prefix install such as pyenv's),
  copied to /usr/local without its site-packages, tests or static library; pip and
  setuptools from its own ensurepip; `python`, `python3`, `pip`, `pip3` in /usr/local/bin;
- the image config of the official image: PATH, LANG=C.UTF-8, PYTHON_VERSION, CMD python3,
  plus a label saying that this is a local stand-in.

    python_base.py --python PREFIX --ref python:3.11-slim-bookworm --out base.tar [--work DIR]

Needs root (it copies root-owned files with their owners and runs ldconfig and ensurepip
inside the new root with chroot).
"""

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

EXTRA_PACKAGES = ("ca-certificates", "netbase", "tzdata")
DOC_PREFIXES = (
    "/usr/share/doc/",
    "/usr/share/man/",
    "/usr/share/info/",
    "/usr/share/locale/",
    "/usr/share/lintian/",
    "/usr/share/linda/",
)
MERGED_USR_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
PYTHON_BIN_KEEP = re.compile(
    r"^(python3(\.\d+)?(-config)?|pydoc3(\.\d+)?|idle3(\.\d+)?|2to3(-\d.*)?)$"
)


def log(msg: str) -> None:
    print(f"python-base: {msg}", file=sys.stderr)


def dpkg_query(*args: str) -> str:
    return subprocess.run(["dpkg-query", *args], capture_output=True, text=True, check=False).stdout


def installed_packages() -> dict[str, dict[str, str]]:
    fields = ("Package", "Priority", "Essential", "db:Status-Abbrev", "Depends", "Pre-Depends")
    fmt = "\\t".join("${" + f + "}" for f in fields) + "\\n"
    out: dict[str, dict[str, str]] = {}
    for line in dpkg_query("-W", "-f", fmt).splitlines():
        name, prio, essential, status, deps, predeps = (line.split("\t") + [""] * 6)[:6]
        if status.startswith("ii"):
            out[name] = {"priority": prio, "essential": essential, "deps": f"{deps}, {predeps}"}
    return out


def _dep_names(text: str, installed: dict[str, dict[str, str]]) -> list[str]:
    """Installed package names satisfying a Depends field (first installed alternative)."""
    names = []
    for clause in text.split(","):
        for alt in clause.split("|"):
            name = alt.strip().split(" ")[0].split(":")[0]
            if name in installed:
                names.append(name)
                break
    return names


def lib_owners(elves: list[Path]) -> set[str]:
    """Packages owning the shared libraries these ELF files load."""
    libs: set[str] = set()
    for elf in elves:
        out = subprocess.run(["ldd", str(elf)], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            m = re.search(r"=>\s+(/\S+)", line)
            if (
                m
                and not m.group(1).startswith(str(elf.parents[0]))
                and "/.pyenv/" not in m.group(1)
            ):
                libs.add(os.path.realpath(m.group(1)))
    owners: set[str] = set()
    for lib in sorted(libs):
        for candidate in (lib, lib.replace("/usr/lib/", "/lib/", 1)):
            out = dpkg_query("-S", candidate).strip()
            if out:
                owners.add(out.split(":")[0].split(",")[0].strip())
                break
        else:
            log(f"warning: no package owns {lib}")
    return owners


def package_set(python_elves: list[Path]) -> list[str]:
    installed = installed_packages()
    todo = [
        n for n, p in installed.items() if p["priority"] == "required" or p["essential"] == "yes"
    ]
    todo += [p for p in EXTRA_PACKAGES if p in installed]
    todo += sorted(lib_owners(python_elves))
    chosen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in chosen or name not in installed:
            continue
        chosen.add(name)
        todo += _dep_names(installed[name]["deps"], installed)
    return sorted(chosen)


def canonical(path: str) -> str:
    """The host path with its parent directory resolved (merged /usr: /bin/x -> /usr/bin/x)."""
    parent, base = os.path.split(path)
    return os.path.join(os.path.realpath(parent), base)


def copy_packages(packages: list[str], root: Path) -> None:
    paths: set[str] = set()
    for pkg in packages:
        for line in dpkg_query("-L", pkg).splitlines():
            if not line.startswith("/") or line in ("/", "/."):
                continue
            if any(line.startswith(p) for p in DOC_PREFIXES) and not line.endswith("/copyright"):
                continue
            path = canonical(line)
            if os.path.lexists(path) and not (os.path.isdir(path) and not os.path.islink(path)):
                paths.add(path.lstrip("/"))
    listing = root.parent / "paths.txt"
    listing.write_text("\n".join(sorted(paths)) + "\n")
    # tar keeps owners, modes, hard links and symlinks exactly; parent dirs are made as needed.
    pack = subprocess.Popen(
        ["tar", "-C", "/", "--no-recursion", "-cf", "-", "-T", str(listing)],
        stdout=subprocess.PIPE,
    )
    subprocess.run(["tar", "-C", str(root), "-xpf", "-"], stdin=pack.stdout, check=True)
    if pack.wait() != 0:
        raise SystemExit("python-base: tar of the package files failed")
    log(f"copied {len(paths)} files of {len(packages)} packages")


def write(root: Path, rel: str, text: str, mode: int = 0o644) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def system_files(root: Path, packages: list[str]) -> None:
    for link, target in MERGED_USR_LINKS.items():
        (root / target).mkdir(parents=True, exist_ok=True)
        if not (root / link).is_symlink():
            if (root / link).exists():
                raise SystemExit(
                    f"python-base: {link} is a directory in the new root; expected merged /usr"
                )
            (root / link).symlink_to(target)
    for d, mode in (
        ("tmp", 0o1777),
        ("root", 0o700),
        ("proc", 0o555),
        ("sys", 0o555),
        ("dev", 0o755),
        ("run", 0o755),
        ("var/tmp", 0o1777),
        ("home", 0o755),
        ("etc", 0o755),
    ):
        (root / d).mkdir(parents=True, exist_ok=True)
        (root / d).chmod(mode)
    if not (root / "var/run").exists():
        (root / "var/run").symlink_to("/run")
    passwd = Path("/usr/share/base-passwd/passwd.master").read_text()
    group = Path("/usr/share/base-passwd/group.master").read_text()
    write(root, "etc/passwd", passwd)
    write(root, "etc/group", group)
    write(
        root,
        "etc/shadow",
        "".join(f"{u.split(':')[0]}:*:19000:0:99999:7:::\n" for u in passwd.splitlines()),
        0o640,
    )
    write(
        root, "etc/gshadow", "".join(f"{g.split(':')[0]}:*::\n" for g in group.splitlines()), 0o640
    )
    nss = Path("/usr/share/libc-bin/nsswitch.conf")
    write(
        root,
        "etc/nsswitch.conf",
        nss.read_text() if nss.exists() else "passwd: files\ngroup: files\nhosts: files dns\n",
    )
    write(root, "etc/hostname", "localhost\n")
    certs = sorted(Path("/usr/share/ca-certificates/mozilla").glob("*.crt"))
    if certs:
        write(root, "etc/ssl/certs/ca-certificates.crt", "".join(c.read_text() for c in certs))
    # dpkg database for exactly these packages, so `apt-get install` in a derived image works.
    status = Path("/var/lib/dpkg/status").read_text().split("\n\n")
    keep = [s for s in status if (m := re.match(r"Package: (\S+)", s)) and m.group(1) in packages]
    write(root, "var/lib/dpkg/status", "\n\n".join(keep).rstrip("\n") + "\n\n")
    info = root / "var/lib/dpkg/info"
    info.mkdir(parents=True, exist_ok=True)
    for pkg in packages:
        for suffix in (".list", ".md5sums", ":amd64.list", ":amd64.md5sums"):
            src = Path(f"/var/lib/dpkg/info/{pkg}{suffix}")
            if src.exists():
                shutil.copy2(src, info / src.name)
    for name in ("available", "diversions", "statoverride"):
        write(root, f"var/lib/dpkg/{name}", "")


def copy_python(prefix: Path, root: Path) -> str:
    """Copy a prefix-installed CPython to /usr/local; return its X.Y.Z version."""
    dest = root / "usr/local"
    pyver = next(p.name for p in (prefix / "lib").glob("python3.*") if p.is_dir())
    skip_dirs = {
        f"lib/{pyver}/site-packages",
        f"lib/{pyver}/test",
        f"lib/{pyver}/idlelib/idle_test",
        f"lib/{pyver}/lib2to3/tests",
        f"lib/{pyver}/tkinter/test",
        f"lib/{pyver}/unittest/test",
        f"lib/{pyver}/ctypes/test",
        f"lib/{pyver}/distutils/tests",
        "share",
        "lib/pkgconfig",
    }

    def ignore(directory: str, names: list[str]) -> list[str]:
        rel = os.path.relpath(directory, prefix)
        out = []
        for n in names:
            sub = os.path.normpath(os.path.join(rel, n))
            if (
                sub in skip_dirs
                or n == "__pycache__"
                or n.endswith((".a", ".pyc"))
                or (
                    n.startswith("_tkinter")  # the official slim image has no Tk either
                )
            ) or (rel == "bin" and not PYTHON_BIN_KEEP.match(n)):
                out.append(n)
        return out

    for part in ("bin", "lib", "include"):
        if (prefix / part).exists() and part not in skip_dirs:
            shutil.copytree(
                prefix / part, dest / part, symlinks=True, ignore=ignore, dirs_exist_ok=True
            )
    (dest / f"lib/{pyver}/site-packages").mkdir(parents=True, exist_ok=True)
    # Scripts installed with the prefix point at its old location.
    for script in (dest / "bin").iterdir():
        if script.is_file() and not script.is_symlink():
            head = script.read_bytes()[:256]
            if head.startswith(b"#!") and str(prefix).encode() in head.split(b"\n", 1)[0]:
                data = script.read_bytes().replace(str(prefix).encode(), b"/usr/local", 1)
                script.write_bytes(data)
    version = subprocess.run(
        [str(prefix / "bin" / pyver), "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return version


def chroot(root: Path, *cmd: str) -> None:
    env = {
        "PATH": "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/root",
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    subprocess.run(["chroot", str(root), *cmd], env=env, check=True)


def finish_python(root: Path) -> None:
    chroot(root, "/sbin/ldconfig")
    chroot(root, "/usr/local/bin/python3", "-m", "ensurepip", "--default-pip")
    bin_dir = root / "usr/local/bin"
    for link, target in (
        ("python", "python3"),
        ("pip", "pip3"),
        ("pydoc", "pydoc3"),
        ("idle", "idle3"),
        ("python-config", "python3-config"),
    ):
        if not (bin_dir / link).exists() and (bin_dir / target).exists():
            (bin_dir / link).symlink_to(target)
    for cache in list(root.joinpath("usr/local").rglob("__pycache__")):
        shutil.rmtree(cache)
    chroot(
        root,
        "/usr/local/bin/python3",
        "-c",
        "import ssl, sqlite3, ctypes, zlib, bz2, lzma, uuid, readline",
    )


def docker_archive(root: Path, *, ref: str, out: Path, python_version: str) -> None:
    layer_path = out.with_suffix(".layer.tar")
    with tarfile.open(layer_path, "w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(root.iterdir()):
            tar.add(entry, arcname=entry.name)
    digest = hashlib.sha256()
    with layer_path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": [
                "PATH=/usr/local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "LANG=C.UTF-8",
                f"PYTHON_VERSION={python_version}",
            ],
            "Cmd": ["python3"],
            "Labels": {
                "io.gpushare.base-image": "local stand-in for "
                + ref
                + ", made by hack/build-image.sh "
                "from this host's Debian packages and Python; not the official image",
            },
        },
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + digest.hexdigest()]},
        "history": [{"created_by": "gpushare hack/lib/python_base.py"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [ref], "Layers": ["layer.tar"]}]
    with tarfile.open(out, "w") as archive:
        for name, data in (
            (config_name, config_bytes),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
        archive.add(layer_path, arcname="layer.tar")
    layer_path.unlink()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", type=Path, required=True, help="CPython install prefix to copy")
    parser.add_argument(
        "--ref", required=True, help="tag of the base image, as in the Dockerfile's FROM"
    )
    parser.add_argument("--out", type=Path, required=True, help="docker-archive tarball to write")
    parser.add_argument("--work", type=Path, help="scratch directory (default: a temporary one)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("python-base: needs root (copies root-owned files, runs chroot)")
    prefix = args.python.resolve()
    if prefix == Path("/usr") or not (prefix / "bin").is_dir():
        raise SystemExit(
            f"python-base: {prefix} is not a prefix-installed CPython (e.g. pyenv's); the Debian "
            "system Python cannot stand in for the official image's /usr/local one"
        )
    work = Path(tempfile.mkdtemp(prefix="python-base.", dir=args.work))
    root = work / "rootfs"
    root.mkdir()
    try:
        elves = [
            p
            for p in prefix.rglob("*.so*")
            if "site-packages" not in p.parts and not p.name.startswith("_tkinter")
        ]
        elves += [
            p for p in (prefix / "bin").glob("python3*") if p.is_file() and not p.is_symlink()
        ]
        packages = package_set(elves)
        log(f"{len(packages)} Debian packages: {' '.join(packages)}")
        copy_packages(packages, root)
        system_files(root, packages)
        version = copy_python(prefix, root)
        finish_python(root)
        docker_archive(root, ref=args.ref, out=args.out, python_version=version)
        log(f"wrote {args.out} ({args.ref}, Python {version})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
