"""Owners of GPU processes from the kubelet's PodResources answer, when the pod list lacks them."""

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bench.exporter.standalone import SimulatedPodProcesses
from gpushare.node.core.podresources.v1 import api_pb2
from gpushare.node.exporter import PodResourcesPoller, SamplerSettings, build_exporter
from gpushare.node.exporter.podresources import ContainerDevices, flatten, gpu_holders
from gpushare.node.gpu.backend import GpuProcess
from gpushare.node.gpu.simulated import SimulatedBackend

UID = "7e1c2d3f-4a5b-4c6d-8e9f-0a1b2c3d4e5f"


def response(gpu: str) -> api_pb2.ListPodResourcesResponse:
    return api_pb2.ListPodResourcesResponse(
        pod_resources=[
            api_pb2.PodResources(
                name="trainer",
                namespace="ml",
                containers=[
                    api_pb2.ContainerResources(
                        name="main",
                        devices=[
                            api_pb2.ContainerDevices(
                                resource_name="gpushare.io/gpu-percent",
                                device_ids=[f"{gpu}::{i:02d}" for i in range(25)],
                            )
                        ],
                    ),
                    api_pb2.ContainerResources(name="sidecar"),
                ],
            ),
            api_pb2.PodResources(
                name="nic",
                namespace="net",
                containers=[
                    api_pb2.ContainerResources(
                        name="c",
                        devices=[
                            api_pb2.ContainerDevices(
                                resource_name="example.com/nic", device_ids=["eth1"]
                            )
                        ],
                    )
                ],
            ),
        ]
    )


def test_kubelet_answer_names_the_container_holding_each_gpu() -> None:
    entries = gpu_holders(flatten(response("GPU-abc")))
    assert entries == [
        ContainerDevices(
            "ml",
            "trainer",
            "main",
            "gpushare.io/gpu-percent",
            tuple(f"GPU-abc::{i:02d}" for i in range(25)),
        )
    ]
    assert entries[0].gpu_uuids() == {"GPU-abc"}


def test_process_of_an_unknown_pod_is_named_by_the_only_container_on_its_gpu(
    tmp_path: Path,
) -> None:
    backend = SimulatedPodProcesses(SimulatedBackend("1xH100-80GB", node_name="n"))
    gpu = backend.inventory()[0].uuid
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::/kubepods/pod{UID}/{'d' * 64}\n")
    backend.set_processes(gpu, [GpuProcess(pid=4242, used_memory_bytes=3 * 2**30)])
    poller = PodResourcesPoller(fetch=lambda: flatten(response(gpu)))
    poller.refresh()
    exporter = build_exporter(
        backend=backend,
        node_name="n",
        placements=list,  # the agent's pod view does not know the pod (yet)
        pod_resources=poller,
        settings=SamplerSettings(proc_root=tmp_path),
    )
    exporter.sampler.sample_once()
    registry = CollectorRegistry()
    registry.register(exporter.collector)
    found = [
        (s.labels["namespace"], s.labels["pod"], s.labels["container"], s.value)
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
        if s.name == "gpushare_pod_gpu_memory_used_bytes"
    ]
    assert found == [("ml", "trainer", "main", 3 * 2**30)]
