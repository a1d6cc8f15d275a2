"""Host paths through /proc reach the whole host (issue 67): ``/proc/1/root/...`` passed the
host-path guard where hostPath is allowed. The webhook judges /proc, /proc/<pid> and any path
through a process's root or working directory as ``/``, as the chart's policy does."""

import pytest

from gpushare.cluster.webhook.review import review
from tests.fixtures.builders import pod_json, webhook_facts


@pytest.mark.parametrize(
    "path",
    [
        "/proc/1/root/var/lib/kubelet/device-plugins",
        "/proc/self/root",
        "/proc/thread-self/cwd/run",
        "/proc/1/task/1/root/run/gpushare",
        "/proc//1/./root",
        "/proc/1",
        "/proc",
    ],
)
def test_a_host_path_through_proc_is_refused(path: str) -> None:
    pod = pod_json(
        "p", fraction="0.5", extra_spec={"volumes": [{"name": "h", "hostPath": {"path": path}}]}
    )
    verdict = review(pod, namespace="default", facts=webhook_facts(), mutate=True)
    assert not verdict.allowed
    assert verdict.errors[0].field == "spec.volumes[0].hostPath.path"


@pytest.mark.parametrize("path", ["/proc/sys/kernel", "/proc/cpuinfo", "/data/proc/1/root"])
def test_other_proc_files_and_look_alikes_stay_allowed(path: str) -> None:
    pod = pod_json(
        "p", fraction="0.5", extra_spec={"volumes": [{"name": "h", "hostPath": {"path": path}}]}
    )
    assert review(pod, namespace="default", facts=webhook_facts(), mutate=True).allowed
