"""The DRA checkpoint read like hostile input (issue #45: a crafted checkpoint crashed the agent
at start and could add a host mount to a claim's CDI spec). A bad entry is dropped on its own
(logged and reported, as an Event on the node by the agent), the others stay prepared, the
agent starts, and a claim's CDI spec is always what the agent writes for its devices and limits,
never the file's edits."""

import json
from pathlib import Path
from typing import Any

import pytest

from gpushare.node.dra.cdi import CdiDir
from gpushare.node.dra.checkpoint import CHECKPOINT_FILE, Checkpoint
from gpushare.node.dra.claims import ClaimRef
from gpushare.node.dra.driver import DraDriver
from gpushare.node.mps.manager import MpsManager
from tests.unit.node.dra.helpers import NODE, FakeClaims, backend, claim, mps_config

UID = "0b1c2d3e-0000-4000-8000-000000000001"
OTHER = "0b1c2d3e-0000-4000-8000-000000000002"
SHARED = claim(
    consumed={"gpuPercent": "25", "memory": "20Gi"},
    config=mps_config(**{"class": "batch", "limit": 50}),
)


def driver(tmp_path: Path, dropped: list[tuple[str, str]] | None = None) -> DraDriver:
    claims = FakeClaims(SHARED)
    return DraDriver(
        node_name=NODE,
        gpus=backend().inventory,
        claims=claims,
        checkpoint=Checkpoint(tmp_path / "plugin" / CHECKPOINT_FILE),
        cdi_dir=CdiDir(tmp_path / "cdi"),
        mps=MpsManager(root=tmp_path / "mps", simulated=True),
        namespace_labels=claims.namespace_labels,
        on_dropped=None if dropped is None else lambda key, why: dropped.append((key, why)),
    )


def prepared_checkpoint(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A node with claim UID prepared (and OTHER, a copy of it under its own UID)."""
    driver(tmp_path).prepare(ClaimRef(namespace="ns", uid=UID, name="c1"))
    path = tmp_path / "plugin" / CHECKPOINT_FILE
    doc = json.loads(path.read_text())
    other = json.loads(json.dumps(doc["claims"][UID]))
    other.update(uid=OTHER, name="c2", cdi_ids=[f"gpu.gpushare.io/claim=claim-{OTHER}"])
    doc["claims"][OTHER] = other
    path.write_text(json.dumps(doc))
    return path, doc


HOSTILE: list[tuple[str, Any]] = [
    ("thread_percent", float("inf")),  # json writes Infinity; int() of it raised OverflowError
    ("thread_percent", 1000),
    ("thread_percent", "9" * 5000),
    ("memory_limit_bytes", -1),
    ("mps", "yes"),
    ("devices", [{"request": "r", "pool": "p", "device": "d", "gpu_uuid": "GPU-not-here"}]),
    ("devices", "x"),
    ("devices", []),
    ("namespace", "../../etc"),
    ("pod", {"nested": [1, 2]}),
    ("cdi_ids", ["gpu.gpushare.io/claim=claim-someone-else"]),
    ("uid", "f" * 36),
    ("edits", [1]),
    ("percent", 0),
]


@pytest.mark.parametrize(("field", "value"), HOSTILE)
def test_a_bad_entry_is_dropped_alone_and_the_agent_starts(
    tmp_path: Path, field: str, value: Any
) -> None:
    path, doc = prepared_checkpoint(tmp_path)
    doc["claims"][OTHER][field] = value
    path.write_text(json.dumps(doc))
    dropped: list[tuple[str, str]] = []
    restarted = driver(tmp_path, dropped)
    assert set(restarted.prepared()) == {UID}  # the good entry stays prepared
    assert len(dropped) == 1 and field.split("_", maxsplit=1)[0] in dropped[0][1].lower() + field, (
        dropped
    )


def test_entries_that_are_not_objects_and_a_deep_document(tmp_path: Path) -> None:
    path, doc = prepared_checkpoint(tmp_path)
    doc["claims"][OTHER] = [1, 2, 3]
    path.write_text(json.dumps(doc))
    assert set(driver(tmp_path).prepared()) == {UID}
    path.write_text('{"version": 1, "claims": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert driver(tmp_path).prepared() == {}  # set aside, not a crash
    assert path.with_name(CHECKPOINT_FILE + ".corrupt").exists()


def test_no_mount_is_taken_from_the_checkpoint(tmp_path: Path) -> None:
    """A host mount added to an entry's edits (and to its CDI spec on disk) is not what the
    agent writes: the restarted agent writes the spec it would write, and answers with it."""
    path, doc = prepared_checkpoint(tmp_path)
    spec_path = CdiDir(tmp_path / "cdi").path(UID)
    honest = json.loads(spec_path.read_text())
    evil = {"hostPath": "/", "containerPath": "/host", "options": ["rbind", "rw"]}
    doc["claims"][UID]["edits"].setdefault("mounts", []).append(evil)
    path.write_text(json.dumps(doc))
    spec = json.loads(spec_path.read_text())
    spec["devices"][0]["containerEdits"].setdefault("mounts", []).append(evil)
    spec_path.write_text(json.dumps(spec))
    restarted = driver(tmp_path)
    assert json.loads(spec_path.read_text()) == honest
    answer = restarted.prepare(ClaimRef(namespace="ns", uid=UID, name="c1"))
    assert evil not in answer.edits.get("mounts", [])
    CdiDir(tmp_path / "cdi").remove(UID)  # a wiped CDI directory is written again: honestly
    restarted.prepare(ClaimRef(namespace="ns", uid=UID, name="c1"))
    assert json.loads(spec_path.read_text()) == honest
