"""bench.faults.security keeps a flood measured on a larger machine (hack/bundle-host-pytest.sh)
apart from the development VM's, names that machine in its own row and says which of the two
met the 2x filter p99 target; a call giving the file without the machine is refused."""

import json
from pathlib import Path

import pytest

from bench.faults import security


def flood(quiet: float, flooded: float) -> dict[str, object]:
    return {
        "filter_p99_quiet_ms": quiet,
        "filter_p99_flood_ms": flooded,
        "admissions_answered": 90,
        "admissions_tried": 90,
        "agent_restarts": 0,
    }


def test_the_larger_machines_flood_gets_its_own_row(tmp_path: Path) -> None:
    (tmp_path / "flood.json").write_text(json.dumps(flood(5.06, 26.95)))
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(flood(1.29, 1.18)))
    doc = security.merge({}, tmp_path, None, elsewhere, "16 cores")
    assert doc["flood_elsewhere"]["machine"] == "16 cores"
    rows = [r for r in security.markdown(doc).splitlines() if "floods every port" in r]
    assert len(rows) == 2
    assert "this 2-core VM" in rows[0] and "(**missed**)" in rows[0]
    assert "16 cores" in rows[1] and "missed" not in rows[1]
    assert "1.29 ms quiet, 1.18 ms flooded" in rows[1]


def test_a_flood_file_without_its_machine_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        security.main(["--from", str(tmp_path), "--flood-elsewhere", str(tmp_path / "f.json")])
    assert "--flood-elsewhere needs --elsewhere MACHINE" in capsys.readouterr().err
