"""The gpu_cluster tests' one handle on the cluster hack/gpu-host-e2e.sh brought up (skips
elsewhere, saying what is needed); its record of checks spans every module."""

from collections.abc import Iterator

import pytest

from tests.gpu_cluster.harness import TEST_NAMESPACE, GpuCluster, from_env


@pytest.fixture(scope="session")
def gc() -> Iterator[GpuCluster]:
    cluster = from_env()
    cluster.kubectl("create", "namespace", TEST_NAMESPACE, check=False)
    yield cluster
    cluster.kubectl("delete", "namespace", TEST_NAMESPACE, "--wait=false", check=False)
