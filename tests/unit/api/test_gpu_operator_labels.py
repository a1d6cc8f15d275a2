"""The GPU Operator's labels for driver upgrades and MIG changes, read as its components write
them (issue #66): which ask gpushare to leave a node, and which values are not understood."""

import pytest

from gpushare.api.gpu_operator import (
    DEPLOY_CLIENT,
    DEPLOY_DEVICE_PLUGIN,
    MIG_CONFIG_STATE,
    UPGRADE_DRAIN_STATES,
    UPGRADE_OTHER_STATES,
    UPGRADE_STATE,
    read_labels,
)


@pytest.mark.parametrize("state", UPGRADE_DRAIN_STATES)
def test_the_upgrade_controllers_states_from_pod_deletion_to_driver_restart_drain(
    state: str,
) -> None:
    pause = read_labels({UPGRADE_STATE: state}).pause
    assert pause is not None and pause.change == "driver upgrade"
    assert pause.describe() == f"the GPU Operator's driver upgrade ({UPGRADE_STATE}={state})"


@pytest.mark.parametrize("state", UPGRADE_OTHER_STATES)
def test_the_other_upgrade_states_leave_gpushare_serving(state: str) -> None:
    assert read_labels({UPGRADE_STATE: state}) == read_labels({})


def test_mig_manager_and_paused_operands() -> None:
    for mig in ("pending", "rebooting"):
        pause = read_labels({MIG_CONFIG_STATE: mig}).pause
        assert pause is not None and pause.change == "MIG change"
    assert read_labels({MIG_CONFIG_STATE: "success", DEPLOY_CLIENT: "true"}).pause is None
    assert read_labels({MIG_CONFIG_STATE: "failed", DEPLOY_DEVICE_PLUGIN: "false"}).pause is None
    client = read_labels({DEPLOY_CLIENT: "paused-for-mig-change"}).pause
    assert client is not None and (client.change, client.label) == ("MIG change", DEPLOY_CLIENT)
    # The driver manager appends its mark to a value other than true/false.
    plugin = read_labels({DEPLOY_DEVICE_PLUGIN: "custom_paused-for-driver-upgrade"}).pause
    assert plugin is not None and plugin.change == "driver upgrade"
    # Two at once: the upgrade state is named first.
    both = read_labels({UPGRADE_STATE: "drain-required", MIG_CONFIG_STATE: "pending"}).pause
    assert both is not None and both.label == UPGRADE_STATE


def test_unexpected_values_are_reported_and_change_nothing() -> None:
    reading = read_labels(
        {
            UPGRADE_STATE: "banana",
            MIG_CONFIG_STATE: "x" * 500,
            DEPLOY_CLIENT: "maybe",
            "nvidia.com/gpu.deploy.dcgm": "paused-for-mig-change",  # not ours to read
        }
    )
    assert reading.pause is None
    assert reading.unexpected == (
        (UPGRADE_STATE, "banana"),
        (MIG_CONFIG_STATE, "x" * 63),
        (DEPLOY_CLIENT, "maybe"),
    )
