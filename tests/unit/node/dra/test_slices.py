"""The node's ResourceSlice from a (simulated) GPU inventory, and publishing it idempotently."""

import dataclasses
import logging

import pytest

from gpushare.api.dra import DRIVER
from gpushare.api.inventory import GpuInfo
from gpushare.node.dra.slices import SlicePublisher, build_slice, slice_device, slice_name
from tests.unit.node.dra.helpers import NODE, FakeSlices, backend


def test_each_gpu_is_a_device_with_its_attributes_and_consumable_capacity() -> None:
    gpus = backend().inventory()
    body = build_slice(node_name=NODE, gpus=gpus, generation=1)
    spec = body["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == (DRIVER, NODE, NODE)
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    first = spec["devices"][0]
    assert first["attributes"] == {
        "uuid": {"string": gpus[0].uuid},
        "model": {"string": "NVIDIA H100 80GB HBM3"},
        "index": {"int": 0},
        "computeCapability": {"version": "9.0.0"},
        "mpsCapable": {"bool": True},
        "simulated": {"bool": True},
    }
    assert first["capacity"]["gpuPercent"] == {
        "value": "100",
        "requestPolicy": {"default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}},
    }
    assert first["capacity"]["memory"]["value"] == str(gpus[0].memory_bytes)
    assert first["capacity"]["memory"]["requestPolicy"]["default"] == "0"
    assert first["allowMultipleAllocations"] is True


def test_unhealthy_gpus_are_not_offered() -> None:
    gpus = backend().inventory()
    gpus[0] = dataclasses.replace(gpus[0], healthy=False)
    body = build_slice(node_name=NODE, gpus=gpus, generation=1)
    assert [d["name"] for d in body["spec"]["devices"]] == ["gpu-1"]


def test_a_gpu_older_than_volta_is_not_mps_capable() -> None:
    pascal = GpuInfo("GPU-p", 0, "Tesla P100", 16 * 2**30, 56, "6.0")
    assert slice_device(pascal)["attributes"]["mpsCapable"] == {"bool": False}


def test_publishing_creates_once_updates_on_change_and_deletes_stale_slices() -> None:
    store = FakeSlices()
    store.slices["old"] = {"metadata": {"name": "old"}, "spec": {"pool": {"generation": 4}}}
    publisher = SlicePublisher(node_name=NODE, store=store)
    gpus = backend().inventory()
    first = publisher.publish(gpus)
    assert first["spec"]["pool"]["generation"] == 5
    assert store.writes == ["create", "delete old"]
    publisher.publish(gpus)
    assert store.writes == ["create", "delete old"], "unchanged GPUs must not be written again"
    gpus[1] = dataclasses.replace(gpus[1], healthy=False)
    second = publisher.publish(gpus)
    assert store.writes[-1] == "replace"
    assert second["spec"]["pool"]["generation"] == 6
    assert list(store.slices) == [slice_name(NODE)]


def test_a_dropped_consumable_capacity_is_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    publisher = SlicePublisher(node_name=NODE, store=FakeSlices(drop_consumable=True))
    gpus = backend().inventory()
    with caplog.at_level(logging.WARNING):
        publisher.publish(gpus)
        gpus[0] = dataclasses.replace(gpus[0], healthy=False)
        publisher.publish(gpus)
    warnings = [r.getMessage() for r in caplog.records if "DRAConsumableCapacity" in r.getMessage()]
    assert len(warnings) == 1


def test_no_warning_where_the_api_server_keeps_consumable_capacity(
    caplog: pytest.LogCaptureFixture,
) -> None:
    publisher = SlicePublisher(node_name=NODE, store=FakeSlices())
    with caplog.at_level(logging.WARNING):
        publisher.publish(backend().inventory())
    assert not publisher.gate_warned
    assert not [r for r in caplog.records if "DRAConsumableCapacity" in r.getMessage()]


def test_a_slice_deleted_behind_the_agents_back_is_written_again() -> None:
    """The kubelet wipes a driver's slices when its plugin is gone for a while; the agent's
    periodic publish puts them back."""
    store = FakeSlices()
    publisher = SlicePublisher(node_name=NODE, store=store)
    gpus = backend().inventory()
    publisher.publish(gpus)
    store.slices.clear()
    publisher.publish(gpus)
    assert store.writes == ["create", "create"]
    assert list(store.slices) == [slice_name(NODE)]
