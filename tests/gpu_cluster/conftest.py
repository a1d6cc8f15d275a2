"""The gpu_cluster tests' one handle on the cluster hack/gpu-host-e2e.sh brought up (skips
elsewhere, saying what is needed); its record of checks spans every module. ``gc`` is the
device-plugin checks' handle; tests/gpu_cluster/dra overrides it for the DRA mode's."""

from collections.abc import Iterator

import pytest

from tests.gpu_cluster.harness import TEST_NAMESPACE, GpuCluster, from_env


@pytest.fixture(scope="session")
def gpu_cluster() -> Iterator[GpuCluster]:
    cluster = from_env()
    cluster.kubectl("create", "namespace", TEST_NAMESPACE, check=False)
    yield cluster
    cluster.kubectl("delete", "namespace", TEST_NAMESPACE, "--wait=false", check=False)


@pytest.fixture
def gc(gpu_cluster: GpuCluster) -> GpuCluster:
    """The cluster, for checks of the device-plugin mode (skips on a DRA-mode cluster)."""
    gpu_cluster.require_mode("deviceplugin")
    return gpu_cluster
