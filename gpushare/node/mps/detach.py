"""Moving an MPS control daemon out of the node agent's container, so it outlives the agent.

When a container stops, the runtime kills every process left in its cgroup, also for hostPID
containers: an MPS daemon the agent started there dies with the agent, and every running pod on
its GPU loses its MPS server ("the remote procedural call between the MPS server and the MPS
client failed"; seen on two H200s, bench/results/gpu-cluster.md). The daemon is therefore moved
into a cgroup of its own on the host (cgroup v2, a direct child of the root); MPS servers it
starts later inherit it. The move runs ``nsenter`` into PID 1's mount and cgroup namespaces (the
agent's own cgroup namespace only sees its container), which needs hostPID and a privileged
container, as the NVML backend already has (docs/node-agent.md, "MPS daemons").
"""

import argparse
import re
import subprocess

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class DetachError(Exception):
    """The daemon could not be moved out of the agent's cgroup."""


def check_cgroup_name(name: str) -> str:
    """A cgroup name for ``--mps-cgroup``: one path component, no slashes or dots first."""
    if not _NAME.match(name):
        raise ValueError(
            f"--mps-cgroup must be one cgroup name (letters, digits, '_', '.', '-'), got {name!r}"
        )
    return name


def detach(pid: int, *, cgroup: str, timeout_s: float = 5.0) -> None:
    """Move process ``pid`` (a host PID) into the host cgroup ``/<cgroup>``; DetachError when
    the host refuses (no cgroup v2, no privileges)."""
    check_cgroup_name(cgroup)
    script = 'mkdir -p "/sys/fs/cgroup/$0" && echo "$1" > "/sys/fs/cgroup/$0/cgroup.procs"'
    command = ["nsenter", "--target", "1", "--mount", "--cgroup", "--", "sh", "-c", script]
    try:
        done = subprocess.run(
            [*command, cgroup, str(pid)],
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DetachError(f"could not run nsenter: {exc}") from exc
    if done.returncode != 0:
        error = done.stderr.decode(errors="replace").strip()[:300]
        raise DetachError(f"moving pid {pid} to cgroup /{cgroup} failed: {error}")


def cgroup_flag(value: str) -> str:
    """``--mps-cgroup``'s type: empty (off) or one cgroup name; argparse shows the refusal."""
    if value == "":
        return ""
    try:
        return check_cgroup_name(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
