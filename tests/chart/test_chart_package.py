"""The chart's package is reproducible (issue #66): ``helm package`` stamps each entry with the
time it ran, so ``make release`` packages through hack/chart_package.py, which keeps Helm's
entries and fixes the rest. Two runs seconds apart give the same bytes; the package holds what
``helm package`` put in it and renders what the chart directory renders."""

import subprocess
import tarfile
import time
from pathlib import Path
from types import ModuleType

from tests.fixtures.helm_chart import CHART, KUBE_VERSION, REPO, Chart
from tests.fixtures.scripts import load_script


def packager() -> ModuleType:
    return load_script(REPO / "hack" / "chart_package.py", "chart_package")


def test_two_packages_seconds_apart_are_byte_identical(chart: Chart, tmp_path: Path) -> None:
    first = packager().package(chart.helm, tmp_path / "a")
    time.sleep(1.1)  # helm's own timestamps now differ
    second = packager().package(chart.helm, tmp_path / "b")
    assert first.name == second.name
    assert first.read_bytes() == second.read_bytes()
    # Helm's plain package differs run to run: the reason for the step.
    plain = []
    for name in ("p", "q"):
        subprocess.run(
            [chart.helm, "package", str(CHART), "-d", str(tmp_path / name)],
            check=True,
            capture_output=True,
        )
        plain.append(next((tmp_path / name).glob("*.tgz")))
        time.sleep(1.1)
    assert plain[0].read_bytes() != plain[1].read_bytes()
    # Same entries, modes and contents as Helm's.
    with tarfile.open(plain[0]) as helm_tar, tarfile.open(first) as ours:
        assert [(m.name, m.mode, m.size) for m in helm_tar] == [
            (m.name, m.mode, m.size) for m in ours
        ]
        for member in ours:
            if member.isfile():
                theirs = helm_tar.extractfile(member.name)
                mine = ours.extractfile(member)
                assert theirs is not None and mine is not None
                assert theirs.read() == mine.read(), member.name
            assert member.uid == member.gid == 0 and member.uname == member.gname == ""


def test_the_package_renders_what_the_chart_directory_renders(chart: Chart, tmp_path: Path) -> None:
    packaged = packager().package(chart.helm, tmp_path)

    def render(source: Path) -> str:
        return subprocess.run(
            [chart.helm, "template", "gpushare", str(source), "--kube-version", KUBE_VERSION],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    assert render(packaged) == render(CHART)
