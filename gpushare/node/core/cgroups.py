"""Which pod a host process belongs to: /proc/<pid>/cgroup -> pod UID and container ID (the
exporter's per-pod GPU memory, the fault monitor's client PIDs, the device plugin's "has this
pod's container started").

NVML reports host PIDs, so the node agent needs the host's /proc (``hostPID: true`` or the host
/proc mounted, then ``proc_root`` points there). The kubelet names pod cgroups after the pod
UID under both cgroup drivers:

- cgroupfs: ``/kubepods/burstable/pod<uid>/<container-id>``
- systemd:  ``/kubepods.slice/.../kubepods-burstable-pod<uid_with_underscores>.slice/
  cri-containerd-<container-id>.scope``

The other way round, :func:`pod_cgroup_dirs` names the directories a pod's cgroup may have
under a hierarchy's mount (both drivers, every QoS class) and :func:`container_cgroup_id`
reads the container ID in a container cgroup's name: how the node agent finds the cgroups to
freeze when it pauses a pod (gpushare.node.pausing).
"""

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

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


QOS_DIRS: Final = {"Guaranteed": "", "Burstable": "burstable", "BestEffort": "besteffort"}
"""The kubelet's QoS class (``status.qosClass``) -> its level under ``kubepods`` (Guaranteed
pods sit directly under it)."""


def pod_cgroup_dirs(uid: str, qos: str | None = None) -> list[str]:
    """Where the kubelet puts pod ``uid``'s cgroup, relative to a hierarchy's mount, for the
    cgroupfs driver (``kubepods/<qos>/pod<uid>``) and the systemd driver
    (``kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_with_underscores>.slice``),
    at its QoS class when known, else at each."""
    levels = [QOS_DIRS[qos]] if qos in QOS_DIRS else list(QOS_DIRS.values())
    under = uid.replace("-", "_")
    out: list[str] = []
    for level in levels:
        if level:
            out.append(f"kubepods/{level}/pod{uid}")
            out.append(f"kubepods.slice/kubepods-{level}.slice/kubepods-{level}-pod{under}.slice")
        else:
            out.append(f"kubepods/pod{uid}")
            out.append(f"kubepods.slice/kubepods-pod{under}.slice")
    return out


def is_pod_cgroup_name(name: str, uid: str) -> bool:
    """Whether a directory named ``name`` is pod ``uid``'s cgroup, whichever driver and root
    the kubelet runs with (``pod<uid>``, or a slice ending ``-pod<uid_with_underscores>``)."""
    return name == f"pod{uid}" or name.endswith(f"-pod{uid.replace('-', '_')}.slice")


def names_a_pod(name: str) -> bool:
    """Whether a cgroup directory named ``name`` is some pod's (``pod<uid>`` or
    ``...-pod<uid_with_underscores>.slice``)."""
    return _POD_UID.search(name) is not None


def container_cgroup_id(name: str) -> str | None:
    """The container ID a container cgroup's directory name holds (``<id>`` under cgroupfs,
    ``cri-containerd-<id>.scope`` and the like under systemd); None for any other name."""
    found = _CONTAINER_ID.search(name)
    return found.group(1) if found else None


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
