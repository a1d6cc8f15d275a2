"""Which pod a host process belongs to: /proc/<pid>/cgroup -> pod UID and container ID (the
exporter's per-pod GPU memory, the fault monitor's client PIDs, the device plugin's "has this
pod's container started").

NVML reports host PIDs, so the node agent needs the host's /proc (``hostPID: true`` or the host
/proc mounted, then ``proc_root`` points there). The kubelet names pod cgroups after the pod
UID under both cgroup drivers:

- cgroupfs: ``/kubepods/burstable/pod<uid>/<container-id>``
- systemd:  ``/kubepods.slice/.../kubepods-burstable-pod<uid_with_underscores>.slice/
  cri-containerd-<container-id>.scope``
"""

import logging
import re
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)
_CONTAINER_ID = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True)
class CgroupOwner:
    """The pod (and container, when the path names one) that owns a process."""

    pod_uid: str
    container_id: str | None


def parse_cgroup(text: str) -> CgroupOwner | None:
    """Find the pod UID and container ID in the contents of /proc/<pid>/cgroup.

    Works for cgroup v1 (one line per hierarchy), v2 (``0::/path``) and hybrid hosts; returns
    None for processes outside any pod (host processes, the MPS server started by the agent
    outside kubepods).
    """
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        path = parts[2].strip()
        match = _POD_UID.search(path)
        if not match:
            continue
        uid = match.group(1).replace("_", "-")
        tail = path[match.end() :]
        cid = None
        for segment in reversed(tail.split("/")):
            found = _CONTAINER_ID.search(segment)
            if found:
                cid = found.group(1)
                break
        return CgroupOwner(pod_uid=uid, container_id=cid)
    return None


def pods_with_running_containers(*, proc_root: Path = Path("/proc")) -> frozenset[str]:
    """UIDs of pods with a live process in a container other than their sandbox. A pod's cgroup
    holds its sandbox's pause process from the start, so a second container ID there means an
    app container runs, whatever the pod's status in the API says yet (a restarted kubelet
    reports it late). Empty when the host's /proc is not visible."""
    ids: dict[str, set[str]] = {}
    try:
        entries = list(proc_root.iterdir())
    except OSError as exc:
        log.debug("cannot list %s: %s", proc_root, exc)
        return frozenset()
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            owner = parse_cgroup((entry / "cgroup").read_text())
        except OSError:
            continue  # gone meanwhile
        if owner is not None and owner.container_id is not None:
            ids.setdefault(owner.pod_uid, set()).add(owner.container_id)
    return frozenset(uid for uid, containers in ids.items() if len(containers) >= 2)
