"""The DeviceClass mps.gpushare.io: made only where a node pool runs the DRA driver, and it
selects exactly that driver's devices."""

from tests.fixtures.helm_chart import LOCAL_VALUES, Chart

DRIVER = "gpu.gpushare.io"


def test_device_plugin_mode_makes_no_device_class(chart: Chart) -> None:
    assert chart.render().all("DeviceClass") == []


def test_dra_mode_makes_a_class_selecting_the_gpushare_driver(chart: Chart) -> None:
    rendered = chart.render({"mode": "dra"}, values_files=[LOCAL_VALUES])
    (dc,) = rendered.all("DeviceClass")
    assert dc["apiVersion"] == "resource.k8s.io/v1"
    assert dc["metadata"]["name"] == "mps.gpushare.io"
    assert "namespace" not in dc["metadata"]  # cluster-scoped
    assert dc["spec"]["selectors"] == [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]


def test_an_extra_dra_pool_makes_the_class_too(chart: Chart) -> None:
    pools = [{"name": "dra", "mode": "dra", "nodeSelector": {"gpushare.io/mode": "dra"}}]
    rendered = chart.render({"node": {"extraPools": pools}})
    assert [d["metadata"]["name"] for d in rendered.all("DeviceClass")] == ["mps.gpushare.io"]


def test_class_can_be_renamed_or_left_to_another_release(chart: Chart) -> None:
    renamed = chart.render({"mode": "dra", "dra": {"deviceClass": {"name": "mps.example.com"}}})
    assert renamed.has("DeviceClass", "mps.example.com")
    off = chart.render({"mode": "dra", "dra": {"deviceClass": {"create": False}}})
    assert off.all("DeviceClass") == []


def test_dra_mode_is_refused_before_kubernetes_1_34(chart: Chart) -> None:
    error = chart.fails({"mode": "dra"}, kube_version="1.33.5")
    assert "needs Kubernetes >= 1.34" in error, error
    assert "DRAConsumableCapacity" in error
