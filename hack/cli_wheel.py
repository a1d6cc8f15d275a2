"""Build the CLI-only distribution ``kubectl-gpushare`` (``make cli-wheel``; docs/cli.md,
"Install").

``kube-gpushare`` installs every component (grpcio, protobuf, kopf, cryptography, ...: about
100 MB). The plugin needs none of that: this wheel holds only the modules ``gpushare.cli.main``
imports (the CLI, ``gpushare.kube.cli`` / ``gpushare.kube.rest`` and the parts of ``gpushare.api``
they use), copied under the import name ``kubectl_gpushare`` so it never shares a file or a
module with ``gpushare`` (ours, or the unrelated project of that name on the package index).
It has no dependency: the build stops if a module of the closure imports anything outside the
standard library. The wheel is a zip of stored entries with fixed timestamps and modes, so the
same sources give the same bytes.
"""

import argparse
import ast
import base64
import hashlib
import re
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = "gpushare"
TARGET = "kubectl_gpushare"
DISTRIBUTION = "kubectl-gpushare"
ENTRY = "gpushare.cli.main"
FIXED_TIME = (1980, 1, 1, 0, 0, 0)
SCRIPTS = {
    "kubectl-gpushare": f"{TARGET}.cli.main:main",
    "kubectl_complete-gpushare": f"{TARGET}.cli.main:complete_main",
}


def _module_file(module: str) -> Path | None:
    base = REPO / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path, module: str) -> set[str]:
    """Every module ``path`` imports (top level or inside functions)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def closure(entry: str = ENTRY) -> dict[str, Path]:
    """The gpushare modules ``entry`` needs (packages' ``__init__`` included), by name."""
    todo, found = [entry], {}
    while todo:
        module = todo.pop()
        if module in found:
            continue
        path = _module_file(module)
        if path is None:
            continue  # a name imported from a module, not a module
        found[module] = path
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        for imported in _imports(path, module):
            top = imported.split(".")[0]
            if top == SOURCE:
                todo.append(imported)
            elif top not in sys.stdlib_module_names and top != "__future__":
                raise SystemExit(
                    f"{path.relative_to(REPO)} imports {imported}, which the CLI-only "
                    "distribution would have to depend on: keep the CLI on the standard library"
                )
    return found


def _rewrite(text: str) -> str:
    """Imports of gpushare become imports of kubectl_gpushare."""
    text = re.sub(r"^(\s*)import gpushare$", rf"\1import {TARGET} as gpushare", text, flags=re.M)
    return re.sub(r"^(\s*)from gpushare(\.|\s)", rf"\1from {TARGET}\2", text, flags=re.M)


def version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def _metadata(ver: str) -> str:
    readme = (REPO / "docs" / "cli.md").read_text()
    return (
        "Metadata-Version: 2.4\n"
        f"Name: {DISTRIBUTION}\n"
        f"Version: {ver}\n"
        "Summary: kubectl gpushare: how gpushare shares NVIDIA GPUs between pods (the CLI "
        "alone, no dependency)\n"
        "Home-page: https://github.com/kube-gpushare/kube-gpushare\n"
        "License-Expression: Apache-2.0\n"
        "License-File: LICENSE\n"
        "Requires-Python: >=3.11\n"
        "Classifier: Environment :: Console\n"
        "Classifier: Programming Language :: Python :: 3 :: Only\n"
        "Classifier: Topic :: System :: Clustering\n"
        "Description-Content-Type: text/markdown\n"
        "\n" + readme
    )


def files(ver: str) -> dict[str, bytes]:
    """Archive name -> contents, RECORD excluded."""
    out: dict[str, bytes] = {}
    for module, path in sorted(closure().items()):
        name = module.replace(SOURCE, TARGET, 1).replace(".", "/")
        name += "/__init__.py" if path.name == "__init__.py" else ".py"
        out[name] = _rewrite(path.read_text()).encode()
    out[f"{TARGET}/py.typed"] = b""
    info = f"kubectl_gpushare-{ver}.dist-info"
    out[f"{info}/METADATA"] = _metadata(ver).encode()
    out[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: hack/cli_wheel.py\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n"
    )
    scripts = "".join(f"{k} = {v}\n" for k, v in SCRIPTS.items())
    out[f"{info}/entry_points.txt"] = f"[console_scripts]\n{scripts}".encode()
    out[f"{info}/licenses/LICENSE"] = (REPO / "LICENSE").read_bytes()
    return out


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


def build(out_dir: Path) -> Path:
    ver = version()
    contents = files(ver)
    record = f"kubectl_gpushare-{ver}.dist-info/RECORD"
    lines = [_record_line(n, d) for n, d in sorted(contents.items())] + [f"{record},,\n"]
    contents[record] = "".join(lines).encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"kubectl_gpushare-{ver}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(contents):
            entry = zipfile.ZipInfo(name, FIXED_TIME)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, contents[name])
    return wheel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist")
    wheel = build(parser.parse_args().out)
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
