"""The NVML backend reads every GPM counter of the one list of counters, by its name of record."""

import pytest

from gpushare.api.profile import RATIOS


def test_gpm_metric_ids_name_the_gpm_counters_of_record() -> None:
    nvml = pytest.importorskip("gpushare.node.gpu.nvml")
    assert set(nvml.GPM_METRIC_IDS) == set(RATIOS) - {"utilization"}
    assert len(set(nvml.GPM_METRIC_IDS.values())) == len(nvml.GPM_METRIC_IDS)
