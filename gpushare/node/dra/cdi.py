"""CDI spec files: how the container runtime learns what a prepared claim adds to a container.

One spec file per prepared claim, holding one device ``claim-<uid>`` of kind
``gpushare.io/gpu`` whose container edits are the same environment, mounts and device nodes
the device plugin's Allocate answers (``gpushare.node.core.answer``). The kubelet
hands the runtime the fully qualified ID ``gpushare.io/gpu=claim-<uid>``; the runtime (containerd
with CDI enabled) reads the spec from the CDI directory. Files are written atomically (a temp
file without the ``.json`` suffix, then a rename), so the runtime never reads half a spec.
"""

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

from gpushare.api.dra import CDI_KIND, CDI_VERSION
from gpushare.api.errors import InvalidInputError
from gpushare.node.core.answer import ContainerAllocation

DEFAULT_CDI_DIR = Path("/var/run/cdi")
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")


def check_uid(uid: str) -> str:
    """A claim UID safe to use in file and CDI device names (the kubelet's input)."""
    if not _UID.match(uid):
        raise InvalidInputError(
            "claim.uid", f"{uid[:70]!r} is not a Kubernetes UID", "the kubelet sends claim UIDs"
        )
    return uid


def device_name(uid: str) -> str:
    return f"claim-{check_uid(uid)}"


def device_id(uid: str) -> str:
    """The fully qualified CDI device ID of a claim: ``gpushare.io/gpu=claim-<uid>``."""
    return f"{CDI_KIND}={device_name(uid)}"


def container_edits(allocation: ContainerAllocation) -> dict[str, Any]:
    """A container answer as CDI ``containerEdits``."""
    edits: dict[str, Any] = {"env": [f"{k}={v}" for k, v in sorted(allocation.envs.items())]}
    if allocation.mounts:
        edits["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": ["rbind", "ro" if m.read_only else "rw"],
            }
            for m in allocation.mounts
        ]
    if allocation.devices:
        edits["deviceNodes"] = [
            {"path": d.container_path, "hostPath": d.host_path, "permissions": d.permissions}
            for d in allocation.devices
        ]
    return edits


def spec(uid: str, edits: dict[str, Any]) -> dict[str, Any]:
    """The CDI spec of one claim."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [{"name": device_name(uid), "containerEdits": edits}],
    }


class CdiDir:
    """The CDI spec directory the runtime reads (``--cdi-dir``)."""

    def __init__(self, root: Path = DEFAULT_CDI_DIR) -> None:
        self.root = root

    def path(self, uid: str) -> Path:
        vendor, cls = CDI_KIND.split("/")
        return self.root / f"{vendor}-{cls}_{device_name(uid)}.json"

    def exists(self, uid: str) -> bool:
        return self.path(uid).is_file()

    def write(self, uid: str, edits: dict[str, Any]) -> Path:
        """Write the claim's spec atomically; returns its path."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.path(uid)
        tmp = final.with_name(f".{final.name}.tmp")
        with tmp.open("w") as out:
            json.dump(spec(uid, edits), out, indent=2, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        tmp.chmod(0o644)
        tmp.replace(final)
        return final

    def remove(self, uid: str) -> None:
        """Remove the claim's spec; a missing file is fine (unprepare is idempotent)."""
        with contextlib.suppress(FileNotFoundError):
            self.path(uid).unlink()
