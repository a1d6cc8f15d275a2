"""The gpushare-scheduler's configuration: the profile and extender the controller expects."""

from typing import Any

import yaml

from gpushare.api.names import RESOURCE_GPU_PERCENT, SCHEDULER_NAME
from tests.fixtures.helm_chart import Chart


def _config(chart: Chart, values: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    release = kw.get("release", "gpushare")
    name = "gpushare-scheduler" if release == "gpushare" else f"{release}-gpushare-scheduler"
    cm = chart.render(values, **kw).get("ConfigMap", name)
    return yaml.safe_load(cm["data"]["config.yaml"])


def test_only_profile_is_the_name_the_webhook_sets(chart: Chart) -> None:
    config = _config(chart)
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == [SCHEDULER_NAME]


def test_extender_filters_scores_and_binds_every_pod_of_the_profile(chart: Chart) -> None:
    config = _config(chart)
    (ext,) = config["extenders"]
    assert (
        ext["urlPrefix"]
        == "https://gpushare-controller-extender.gpushare-system.svc:8888/scheduler"
    )
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["preemptVerb"], ext["bindVerb"]) == (
        "filter",
        "prioritize",
        "preempt",
        "bind",
    )
    assert ext["nodeCacheCapable"] is True
    assert ext["ignorable"] is False
    # No managedResources: pods without GPUs sent to gpushare-scheduler are placed by the
    # extender too. The scheduler's own resource fit counts the GPU share per node (nothing
    # ignores gpushare.io/gpu-percent): its window of feasible nodes skips full ones.
    assert "managedResources" not in ext
    (profile,) = config["profiles"]
    fits = [p for p in profile.get("pluginConfig") or [] if p["name"] == "NodeResourcesFit"]
    assert all(
        RESOURCE_GPU_PERCENT not in (f.get("args") or {}).get("ignoredResources", []) for f in fits
    )


def test_extender_url_follows_release_port_and_pinned_ip(chart: Chart) -> None:
    (ext,) = _config(
        chart, {"controller": {"extender": {"port": 18888}}}, release="r", namespace="n"
    )["extenders"]
    assert ext["urlPrefix"] == "https://r-gpushare-controller-extender.n.svc:18888/scheduler"
    (ext,) = _config(chart, {"controller": {"service": {"clusterIP": "10.96.88.88"}}})["extenders"]
    assert ext["urlPrefix"] == "https://10.96.88.88:8888/scheduler"


def test_leader_election_uses_its_own_lease(chart: Chart) -> None:
    election = _config(chart, release="r", namespace="n")["leaderElection"]
    assert election == {
        "leaderElect": True,
        "resourceNamespace": "n",
        "resourceName": "r-gpushare-scheduler",
    }


def test_nodes_to_score_is_the_schedulers_default_unless_set(chart: Chart) -> None:
    (profile,) = _config(chart)["profiles"]
    assert "percentageOfNodesToScore" not in profile
    (profile,) = _config(chart, {"scheduler": {"percentageOfNodesToScore": 25}})["profiles"]
    assert profile["percentageOfNodesToScore"] == 25
