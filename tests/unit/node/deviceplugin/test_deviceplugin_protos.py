"""The committed stubs match the .proto files, and the .proto matches the kubelet's wire API."""

import subprocess

from gpushare.node.core.podresources.v1 import api_pb2 as podresources
from gpushare.node.deviceplugin.v1beta1 import api_pb2
from tests import REPO


def test_regenerating_the_stubs_changes_nothing() -> None:
    done = subprocess.run(
        ["bash", str(REPO / "hack" / "verify-protos.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _fields(message: type) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_services_have_the_names_the_kubelet_calls() -> None:
    services = api_pb2.DESCRIPTOR.services_by_name
    assert services["Registration"].full_name == "v1beta1.Registration"
    assert [m.name for m in services["DevicePlugin"].methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    assert services["DevicePlugin"].methods_by_name["ListAndWatch"].server_streaming
    lister = podresources.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert lister.full_name == "v1.PodResourcesLister"


def test_field_numbers_match_the_kubelet_wire_format() -> None:
    assert _fields(api_pb2.RegisterRequest) == {
        "version": 1,
        "endpoint": 2,
        "resource_name": 3,
        "options": 4,
    }
    assert _fields(api_pb2.DevicePluginOptions) == {
        "pre_start_required": 1,
        "get_preferred_allocation_available": 2,
    }
    assert _fields(api_pb2.Device) == {"ID": 1, "health": 2, "topology": 3}
    assert _fields(api_pb2.ContainerPreferredAllocationRequest) == {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    }
    assert _fields(api_pb2.ContainerAllocateResponse) == {
        "envs": 1,
        "mounts": 2,
        "devices": 3,
        "annotations": 4,
        "cdi_devices": 5,
    }
    assert _fields(api_pb2.Mount) == {"container_path": 1, "host_path": 2, "read_only": 3}
    assert _fields(api_pb2.DeviceSpec) == {"container_path": 1, "host_path": 2, "permissions": 3}
    assert _fields(podresources.ContainerDevices) == {
        "resource_name": 1,
        "device_ids": 2,
        "topology": 3,
    }
