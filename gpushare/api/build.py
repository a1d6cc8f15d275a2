"""What every gpushare process says about its own build on /metrics: the
``gpushare_build_info{version, component, python_version} 1`` series (docs/observability.md,
"Build and process series"), so a dashboard or alert can tell which version runs where and a
mixed rollout shows as two versions."""

import platform

import gpushare
from gpushare.api.names import METRIC_PREFIX

BUILD_INFO_METRIC = f"{METRIC_PREFIX}build_info"
BUILD_INFO_HELP = "Always 1; the labels name this gpushare process's version and component"
BUILD_INFO_LABELS = ("version", "component", "python_version")


def build_info_values(component: str) -> tuple[str, str, str]:
    """The label values, in :data:`BUILD_INFO_LABELS` order, of ``component`` (controller,
    node-agent, exporter)."""
    return (gpushare.__version__, component, platform.python_version())
