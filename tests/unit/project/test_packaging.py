"""What `pip install kube-gpushare` and the image install: declared dependencies cover every
import, each has a lower and an upper bound, requirements.lock pins all of them and is what
this environment, CI and the Dockerfile install (docs/development.md, "Dependencies")."""

import ast
import re
import sys
import tomllib
from importlib import metadata

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
RUNTIME = [Requirement(d) for d in PROJECT["dependencies"]]
DEV = [Requirement(d) for d in PROJECT["optional-dependencies"]["dev"]]


def lock_pins() -> dict[str, tuple[Version, Requirement]]:
    """requirements.lock as name -> (version, requirement with its marker)."""
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if not line or line.startswith(("#", " ")):
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==", f"requirements.lock: {line!r} is not an exact pin"
        pins[canonicalize_name(req.name)] = (Version(spec.version), req)
    return pins


def imported_top_level_modules() -> set[str]:
    """Top-level modules `gpushare` imports, outside itself and the standard library."""
    found: set[str] = set()
    for path in (REPO / "gpushare").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m != "gpushare" and m not in sys.stdlib_module_names}


def test_every_imported_module_comes_from_a_declared_runtime_dependency() -> None:
    """An import of a package that only arrives through another dependency (httpx2 through
    lightkube) breaks when that dependency changes its own; declare it."""
    declared = {canonicalize_name(r.name) for r in RUNTIME}
    providers = metadata.packages_distributions()
    undeclared = {
        module: providers.get(module, ["<not installed>"])
        for module in imported_top_level_modules()
        if not declared & {canonicalize_name(d) for d in providers.get(module, [])}
    }
    assert undeclared == {}, f"imported but not in [project] dependencies: {undeclared}"


def test_runtime_dependencies_have_lower_and_upper_bounds() -> None:
    for req in RUNTIME:
        ops = {s.operator for s in req.specifier}
        assert ">=" in ops and "<" in ops, f"{req}: give a lower (>=) and an upper (<) bound"


def test_lightkube_lower_bound_is_a_release_that_uses_httpx2() -> None:
    """lightkube 1.0 moved from httpx to httpx2, which the code imports next to it."""
    (lightkube,) = [r for r in RUNTIME if canonicalize_name(r.name) == "lightkube"]
    lower = min(Version(s.version) for s in lightkube.specifier if s.operator == ">=")
    assert lower >= Version("1.0")
    requires = metadata.requires("lightkube") or []
    assert any(canonicalize_name(Requirement(r).name) == "httpx2" for r in requires)


def test_the_lock_pins_every_dependency_within_its_declared_range() -> None:
    pins = lock_pins()
    for req in [*RUNTIME, *DEV]:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in requirements.lock: run `make lock`"
        assert req.specifier.contains(pins[name][0], prereleases=True), (
            f"requirements.lock pins {req.name}=={pins[name][0]}, outside {req.specifier}: "
            "run `make lock`"
        )


def test_this_environment_was_installed_from_the_lock() -> None:
    """`make venv` (so CI) installs with requirements.lock as constraints: every locked
    distribution that applies to this interpreter is installed at its pinned version."""
    env = default_environment()
    wrong = {}
    for name, (version, req) in lock_pins().items():
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            wrong[name] = f"missing, lock pins {version}"
            continue
        if installed != version:
            wrong[name] = f"{installed} installed, lock pins {version}"
    assert wrong == {}, f"not installed from requirements.lock (run `make venv`): {wrong}"


def test_the_image_build_installs_from_the_lock() -> None:
    dockerfile = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    pip_steps = re.findall(r"pip (?:install|wheel)[^\n&]*", dockerfile)
    assert len(pip_steps) == 3, pip_steps
    for step in pip_steps:
        assert "requirements.lock" in step, f"a pip step ignores the lock: {step!r}"
    ignore = (REPO / ".dockerignore").read_text().split()
    for needed in ("!requirements.lock", "!LICENSE", "!pyproject.toml", "!gpushare/"):
        assert needed in ignore, f".dockerignore keeps {needed[1:]} out of the build context"


def test_image_labels_carry_version_and_revision() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    for label, arg in (("version", "VERSION"), ("revision", "REVISION")):
        assert f'org.opencontainers.image.{label}="${{{arg}}}"' in dockerfile
    assert f'org.opencontainers.image.source="{PROJECT["urls"]["Source"]}"' in dockerfile
    build = (REPO / "hack" / "build-image.sh").read_text()
    assert '--build-arg "VERSION=$version"' in build and '--build-arg "REVISION=' in build


def test_distribution_name_license_and_entry_points() -> None:
    """`gpushare` on the package index is another project; ours is `kube-gpushare`, while the
    import package and the commands keep the gpushare name."""
    assert PROJECT["name"] == "kube-gpushare"
    assert PROJECT["license"] == "Apache-2.0"
    assert "Apache License" in (REPO / "LICENSE").read_text()
    assert "Version 2.0, January 2004" in (REPO / "LICENSE").read_text()
    assert set(PROJECT["scripts"]) == {
        "gpushare",
        "gpushare-controller",
        "gpushare-node-agent",
        # The MPS daemons' own DaemonSet, <release>-mps-daemons (docs/node-agent.md, "MPS daemons").
        "gpushare-mps-launcher",
        "kubectl-gpushare",
        # kubectl's plugin completion runs kubectl_complete-<plugin> (docs/cli.md).
        "kubectl_complete-gpushare",
    }
    assert PROJECT["urls"].keys() >= {"Homepage", "Source", "Issues", "Documentation"}
    assert any(c.startswith("License ::") for c in PROJECT["classifiers"]) is False, (
        "PEP 639: the license expression replaces license classifiers"
    )
    dist = metadata.distribution("kube-gpushare")
    assert dist.metadata["License-Expression"] == "Apache-2.0"
    assert {ep.name for ep in dist.entry_points} >= set(PROJECT["scripts"])


def test_the_image_base_is_pinned_by_digest_in_every_stage() -> None:
    """Issue #66: a tag moves; the digest names one set of bytes (an OCI index: every
    platform). The offline build passes its stand-in as BASE_IMAGE."""
    dockerfile = (REPO / "Dockerfile").read_text()
    (base,) = re.findall(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, flags=re.M)
    assert re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", base), base
    stages = re.findall(r"^FROM (\S+)", dockerfile, flags=re.M)
    assert stages == ["${BASE_IMAGE}", "${BASE_IMAGE}"], stages
    build = (REPO / "hack" / "build-image.sh").read_text()
    assert '--build-arg "BASE_IMAGE=$base"' in build
