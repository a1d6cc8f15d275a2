"""The DRA mode's handle on the real-GPU cluster: hack/gpu-host-e2e.sh --mode dra brings it up
with the chart's ``mode: dra``; on a device-plugin-mode cluster these checks skip."""

import pytest

from tests.gpu_cluster.harness import GpuCluster


@pytest.fixture
def gc(gpu_cluster: GpuCluster) -> GpuCluster:
    """The cluster, for checks of the DRA mode (skips on a device-plugin-mode cluster)."""
    gpu_cluster.require_mode("dra")
    return gpu_cluster
