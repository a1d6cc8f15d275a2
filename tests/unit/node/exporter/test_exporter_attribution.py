"""Per-pod GPU memory: which pod and container a GPU process belongs to.

The cgroup texts below are what /proc/<pid>/cgroup holds on kubelets with each cgroup driver;
the per-pod test reads them from a directory laid out like /proc (the exporter's ``proc_root``
is the host /proc mounted into the agent), so the whole PID -> cgroup -> pod chain runs.
"""

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bench.exporter.standalone import SimulatedPodProcesses
from gpushare.node.core.cgroups import CgroupOwner, parse_cgroup, pods_with_running_containers
from gpushare.node.exporter import PodAllocation, SamplerSettings, build_exporter
from gpushare.node.exporter.attribution import ProcessResolver
from gpushare.node.gpu.backend import GpuProcess
from gpushare.node.gpu.simulated import SimulatedBackend

UID = "0f9b7d2e-3c41-4b8a-9e77-5d2c1a0b9f10"
CID = "a" * 64
CID2 = "b" * 64

SYSTEMD_V2 = (
    "0::/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
)
CGROUPFS_V1 = (
    f"12:memory:/kubepods/besteffort/pod{UID}/{CID}\n"
    f"11:cpu,cpuacct:/kubepods/besteffort/pod{UID}/{CID}\n"
    "1:name=systemd:/\n"
)
GUARANTEED_V2 = f"0::/kubepods/pod{UID}/{CID}\n"
HOST = "0::/system.slice/nvidia-mps.service\n"


def test_pod_uid_and_container_from_systemd_cgroup_v2() -> None:
    assert parse_cgroup(SYSTEMD_V2) == CgroupOwner(pod_uid=UID, container_id=CID)


def test_pod_uid_and_container_from_cgroupfs_v1() -> None:
    assert parse_cgroup(CGROUPFS_V1) == CgroupOwner(pod_uid=UID, container_id=CID)


def test_guaranteed_pod_without_qos_level() -> None:
    assert parse_cgroup(GUARANTEED_V2) == CgroupOwner(pod_uid=UID, container_id=CID)


def test_pod_sandbox_level_has_no_container() -> None:
    assert parse_cgroup(f"0::/kubepods/burstable/pod{UID}\n") == CgroupOwner(UID, None)


def test_host_process_belongs_to_no_pod() -> None:
    assert parse_cgroup(HOST) is None
    assert parse_cgroup("") is None


def test_resolver_reports_vanished_process_as_unowned(tmp_path: Path) -> None:
    assert ProcessResolver(proc_root=tmp_path).resolve(424242) is None


def _proc(root: Path, pid: int, text: str) -> None:
    (root / str(pid)).mkdir()
    (root / str(pid) / "cgroup").write_text(text)


def test_memory_of_a_pods_processes_adds_up_per_container(tmp_path: Path) -> None:
    _proc(tmp_path, 100, SYSTEMD_V2)
    _proc(tmp_path, 101, SYSTEMD_V2)
    _proc(tmp_path, 102, SYSTEMD_V2.replace(CID, CID2))
    _proc(tmp_path, 200, HOST)
    backend = SimulatedPodProcesses(SimulatedBackend("1xH100-80GB", node_name="n"))
    gpu = backend.inventory()[0].uuid
    backend.set_processes(
        gpu,
        [
            GpuProcess(pid=100, used_memory_bytes=3 * 2**30, mps_client=True),
            GpuProcess(pid=101, used_memory_bytes=1 * 2**30, mps_client=True),
            GpuProcess(pid=102, used_memory_bytes=2**29, mps_client=True),
            GpuProcess(pid=200, used_memory_bytes=2**28),  # the MPS server, outside any pod
        ],
    )
    pod = PodAllocation(
        namespace="ml",
        name="trainer",
        uid=UID,
        gpu_uuids=(gpu,),
        compute_ratio=0.5,
        thread_percent=50,
        memory_limit_bytes=8 * 2**30,
        containers={CID: "main", CID2: "sidecar"},
    )
    exporter = build_exporter(
        backend=backend,
        node_name="n",
        placements=lambda: [pod],
        settings=SamplerSettings(proc_root=tmp_path),
    )
    registry = CollectorRegistry()
    registry.register(exporter.collector)
    exporter.sampler.sample_once()
    found = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name == "gpushare_pod_gpu_memory_used_bytes":
                found[(s.labels["namespace"], s.labels["pod"], s.labels["container"])] = s.value
            if s.name == "gpushare_gpu_unattributed_memory_used_bytes":
                found[("", "unattributed", "")] = s.value
            if s.name == "gpushare_mps_clients":
                found[("", "mps_clients", "")] = s.value
    assert found == {
        ("ml", "trainer", "main"): 4 * 2**30,
        ("ml", "trainer", "sidecar"): 2**29,
        ("", "unattributed", ""): 2**28,
        ("", "mps_clients", ""): 3,
    }


def test_a_pod_runs_a_container_once_one_besides_its_sandbox_has_a_process(
    tmp_path: Path,
) -> None:
    other = "1e4c2b7a-90d3-4f65-8a21-3b9c7d6e5f40"
    _proc(tmp_path, 100, CGROUPFS_V1)  # the pod's sandbox (pause) only: nothing runs yet
    _proc(tmp_path, 300, GUARANTEED_V2.replace(UID, other))
    _proc(tmp_path, 301, GUARANTEED_V2.replace(UID, other).replace(CID, CID2))
    _proc(tmp_path, 400, HOST)
    (tmp_path / "self").mkdir()
    assert pods_with_running_containers(proc_root=tmp_path) == {other}
    _proc(tmp_path, 101, CGROUPFS_V1.replace(CID, CID2))  # its app container starts
    assert pods_with_running_containers(proc_root=tmp_path) == {UID, other}
    assert pods_with_running_containers(proc_root=tmp_path / "absent") == frozenset()
