"""The committed DRA protos speak the kubelet's wire format: service paths and field numbers."""

from gpushare.node.dra.pluginregistration.v1 import api_pb2 as registration
from gpushare.node.dra.v1 import api_pb2 as v1
from gpushare.node.dra.v1beta1 import api_pb2 as v1beta1


def _fields(message: type) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_services_have_the_names_the_kubelet_calls() -> None:
    for module, version in ((v1, "v1"), (v1beta1, "v1beta1")):
        service = module.DESCRIPTOR.services_by_name["DRAPlugin"]
        assert service.full_name == f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
        assert [m.name for m in service.methods] == [
            "NodePrepareResources",
            "NodeUnprepareResources",
        ]
    service = registration.DESCRIPTOR.services_by_name["Registration"]
    assert service.full_name == "pluginregistration.Registration"
    assert [m.name for m in service.methods] == ["GetInfo", "NotifyRegistrationStatus"]


def test_messages_have_the_kubelets_field_numbers() -> None:
    for module in (v1, v1beta1):
        assert _fields(module.Claim) == {"namespace": 1, "uid": 2, "name": 3}
        assert _fields(module.Device) == {
            "request_names": 1,
            "pool_name": 2,
            "device_name": 3,
            "cdi_device_ids": 4,
        }
        assert _fields(module.NodePrepareResourceResponse) == {"devices": 1, "error": 2}
        assert _fields(module.NodeUnprepareResourceResponse) == {"error": 1}
    assert _fields(registration.PluginInfo) == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert _fields(registration.RegistrationStatus) == {"plugin_registered": 1, "error": 2}
