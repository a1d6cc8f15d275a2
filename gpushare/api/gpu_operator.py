"""The GPU Operator's node labels that say a node's GPUs are about to change under their users:
a driver upgrade or a MIG reconfiguration (docs/coexistence.md, "Driver upgrades and MIG
changes"). Read once here, by the node agent (which drains gpushare's pods and MPS daemons
off the node) and checked against the chart's hook; pure, no I/O.

Names and values as the GPU Operator's components write them:

- ``nvidia.com/gpu-driver-upgrade-state``, the upgrade controller's state machine (NVIDIA
  k8s-operator-libs, pkg/upgrade): ``upgrade-required``, ``cordon-required``,
  ``wait-for-jobs-required``, ``pod-deletion-required`` (it deletes the GPU pods it
  recognises: those asking for ``nvidia.com/gpu*``, never gpushare's), ``drain-required``,
  ``node-maintenance-required``, ``post-maintenance-required``, ``pod-restart-required`` (the
  driver pod restarts and unloads the kernel modules), ``validation-required``,
  ``uncordon-required``, ``upgrade-done``, ``upgrade-failed``.
- ``nvidia.com/mig.config.state``, mig-manager: ``pending`` and ``rebooting`` while it changes
  the layout, then ``success`` or ``failed``.
- ``nvidia.com/gpu.deploy.<operand>``: ``true`` or ``false``; mig-manager pauses an operand with
  ``paused-for-mig-change``, the driver manager with ``paused-for-driver-upgrade`` (appended
  to a value other than ``true``/``false`` after an ``_``). ``client`` is the one for GPU
  clients outside the operator: both wait for DaemonSet pods selecting it to end.

Any other value is not understood: it is reported (the caller logs it) and changes nothing.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

UPGRADE_STATE: Final = "nvidia.com/gpu-driver-upgrade-state"
MIG_CONFIG_STATE: Final = "nvidia.com/mig.config.state"
DEPLOY_CLIENT: Final = "nvidia.com/gpu.deploy.client"
DEPLOY_DEVICE_PLUGIN: Final = "nvidia.com/gpu.deploy.device-plugin"
PAUSED_FOR_MIG: Final = "paused-for-mig-change"
PAUSED_FOR_DRIVER: Final = "paused-for-driver-upgrade"

UPGRADE_DRAIN_STATES: Final = (
    "pod-deletion-required",
    "drain-required",
    "node-maintenance-required",
    "post-maintenance-required",
    "pod-restart-required",
)
"""From the deletion of GPU pods to the driver pod's restart: no GPU user may stay."""
UPGRADE_OTHER_STATES: Final = (
    "upgrade-required",
    "cordon-required",
    "wait-for-jobs-required",
    "validation-required",
    "uncordon-required",
    "upgrade-done",
    "upgrade-failed",
)
MIG_DRAIN_STATES: Final = ("pending", "rebooting")
MIG_OTHER_STATES: Final = ("success", "failed")
DEPLOY_LABELS: Final = (DEPLOY_CLIENT, DEPLOY_DEVICE_PLUGIN)
PAUSED_VALUES: Final = {PAUSED_FOR_MIG: "MIG change", PAUSED_FOR_DRIVER: "driver upgrade"}
_MAX_VALUE = 63
"""Kubernetes label values are at most 63 characters; a longer one is shown cut."""


@dataclass(frozen=True)
class OperatorPause:
    """The GPU Operator is changing this node's GPUs: what, and the label that says so."""

    change: str
    """``driver upgrade`` or ``MIG change``."""
    label: str
    value: str

    def describe(self) -> str:
        return f"the GPU Operator's {self.change} ({self.label}={self.value})"


@dataclass(frozen=True)
class LabelReading:
    pause: OperatorPause | None
    """The first label (in the order above) that asks GPU users to leave; None: none does."""
    unexpected: tuple[tuple[str, str], ...] = ()
    """(label, value) pairs of these labels with a value gpushare does not know: ignored."""


def _deploy_pause(value: str) -> str | None:
    for paused, change in PAUSED_VALUES.items():
        if paused in value:
            return change
    return None


def read_labels(labels: Mapping[str, str]) -> LabelReading:
    """Whether a node's labels ask GPU users to leave, and which values were not understood."""
    pauses: list[OperatorPause] = []
    unexpected: list[tuple[str, str]] = []
    state = labels.get(UPGRADE_STATE)
    if state:
        if state in UPGRADE_DRAIN_STATES:
            pauses.append(OperatorPause("driver upgrade", UPGRADE_STATE, state))
        elif state not in UPGRADE_OTHER_STATES:
            unexpected.append((UPGRADE_STATE, state[:_MAX_VALUE]))
    mig = labels.get(MIG_CONFIG_STATE)
    if mig:
        if mig in MIG_DRAIN_STATES:
            pauses.append(OperatorPause("MIG change", MIG_CONFIG_STATE, mig))
        elif mig not in MIG_OTHER_STATES:
            unexpected.append((MIG_CONFIG_STATE, mig[:_MAX_VALUE]))
    for label in DEPLOY_LABELS:
        value = labels.get(label)
        if not value or value in ("true", "false"):
            continue
        change = _deploy_pause(value)
        if change is not None:
            pauses.append(OperatorPause(change, label, value[:_MAX_VALUE]))
        else:
            unexpected.append((label, value[:_MAX_VALUE]))
    return LabelReading(pause=pauses[0] if pauses else None, unexpected=tuple(unexpected))
