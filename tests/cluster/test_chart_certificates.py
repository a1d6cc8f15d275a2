"""The chart's default certificates on the local cluster: made at run time by the controller
(the chart renders none, so two renders are byte-identical), owned by its Deployment, and
renewed while pods are admitted and bound, without a failed admission or bind and without a
manual restart of gpushare-scheduler (kube-scheduler reads its extender CA and client
certificate only at start: the controller restarts it).

Uses the chart release fixtures of tests/fixtures/chart_release.py (the images built from the
Dockerfile, exclusive use of the node)."""

import base64
import json
import threading
import time
import uuid
from typing import Any

import pytest

from gpushare.cluster.certificates import CREDENTIALS_ANNOTATION
from gpushare.cluster.issuing import RENEW_ANNOTATION
from tests.fixtures.chart_release import (
    NAMESPACE,
    RELEASE,
    check_nothing_left,
    component,
    diagnostics,
    exclusive_node,
    helm,
    kjson,
    ready,
    release_pods,
    remove_release,
    wait_for,
    wait_ready_release_pods,
    wait_webhook_serving,
    workload_pod,
)
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.helm_chart import CHART, LOCAL_VALUES

pytestmark = [pytest.mark.cluster, pytest.mark.whole_node]

CONTROLLER = f"{RELEASE}-controller"
SCHEDULER = f"{RELEASE}-scheduler"
LEAVES = ("webhook-tls", "extender-tls", "extender-client")


def secret(cluster: LocalCluster, suffix: str) -> dict[str, Any]:
    return kjson(cluster, "get", "secret", "-n", NAMESPACE, f"{CONTROLLER}-{suffix}")  # type: ignore[no-any-return]


def scheduler_pods(cluster: LocalCluster) -> list[dict[str, Any]]:
    return [p for p in release_pods(cluster) if component(p) == "scheduler"]


def scheduler_credentials(cluster: LocalCluster) -> str:
    """What the controller recorded gpushare-scheduler's pods run with."""
    deploy = kjson(cluster, "get", "deployment", "-n", NAMESPACE, SCHEDULER)
    return str(deploy["metadata"].get("annotations", {}).get(CREDENTIALS_ANNOTATION, ""))


def scheduler_replicasets(cluster: LocalCluster) -> int:
    return len(
        kjson(
            cluster, "get", "replicasets", "-n", NAMESPACE,
            "-l", "app.kubernetes.io/component=scheduler",
        )["items"]
    )  # fmt: skip


def settled_scheduler(cluster: LocalCluster) -> str | None:
    """The one scheduler pod's uid once the rollout is over (one pod, Ready)."""
    pods = [p for p in scheduler_pods(cluster) if not p["metadata"].get("deletionTimestamp")]
    if len(scheduler_pods(cluster)) == 1 and len(pods) == 1 and ready(pods[0]):
        return str(pods[0]["metadata"]["uid"])
    return None


def state(cluster: LocalCluster) -> str:
    """What a failed wait needs: the controllers' certificate log lines, the scheduler's
    Deployment annotations, ReplicaSets and pods."""
    lines = [diagnostics(cluster)]
    for pod in release_pods(cluster):
        if component(pod) == "controller":
            log = cluster.kubectl("logs", "-n", NAMESPACE, pod["metadata"]["name"], check=False)
            wanted = [
                line for line in log.splitlines() if "certific" in line or "error" in line.lower()
            ]
            lines += [f"--- {pod['metadata']['name']}", *wanted[-40:]]
    deploy = kjson(cluster, "get", "deployment", "-n", NAMESPACE, SCHEDULER)
    lines.append(json.dumps(deploy["metadata"].get("annotations"), indent=1))
    lines.append(json.dumps(deploy["spec"]["template"]["metadata"].get("annotations"), indent=1))
    lines.append(json.dumps(deploy.get("status"), indent=1))
    lines.append(cluster.kubectl("get", "rs,pods", "-n", NAMESPACE, "-o", "wide", check=False))
    return "\n".join(lines)


def controller_logs(cluster: LocalCluster) -> str:
    return "".join(
        cluster.kubectl("logs", "-n", NAMESPACE, p["metadata"]["name"], check=False)
        for p in release_pods(cluster)
        if component(p) == "controller"
    )


def reloaded(logs: str) -> bool:
    """Both controller replicas reloaded the webhook's certificate, the leader the extender's."""
    return logs.count("webhook certificate reloaded") >= 2 and (
        "extender certificates reloaded" in logs
    )


def test_certificates_made_at_run_time_renew_without_a_failed_admission_or_bind(
    cluster: LocalCluster, images: None
) -> None:
    work = f"gpushare-certs-{uuid.uuid4().hex[:6]}"
    with exclusive_node(cluster):
        remove_release(cluster)
        try:
            helm(
                cluster, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                "--create-namespace", "--values", str(LOCAL_VALUES), "--wait", "--timeout", "5m",
            )  # fmt: skip
            pods = wait_ready_release_pods(cluster, timeout_s=180)
            assert all(ready(p) for p in pods), [p["status"] for p in pods]
            wait_webhook_serving(cluster)

            # -- made by the controller, owned by its Deployment, one CA ---------------------
            ca = secret(cluster, "ca")
            ca_pem = base64.b64decode(ca["data"]["tls.crt"])
            for suffix in ("ca", *LEAVES):
                obj = secret(cluster, suffix)
                (owner,) = obj["metadata"]["ownerReferences"]
                assert (owner["kind"], owner["name"]) == ("Deployment", CONTROLLER)
                assert "helm.sh/chart" not in obj["metadata"].get("labels", {}), "not Helm's"
                if suffix != "ca":
                    assert base64.b64decode(obj["data"]["ca.crt"]) == ca_pem
            # The scheduler's first pod waited for the Secrets, so it runs with them: the
            # controller records that and restarts nothing.
            first = wait_for(
                lambda: scheduler_credentials(cluster) and settled_scheduler(cluster),
                timeout_s=180,
                what="gpushare-scheduler running with the controller's credentials",
            )
            assert scheduler_replicasets(cluster) == 1, "restarted at install for nothing"
            credentials = scheduler_credentials(cluster)
            before = {s: secret(cluster, s)["data"]["tls.crt"] for s in LEAVES}

            # -- renewed while pods are created and bound ------------------------------------
            cluster.kubectl("create", "namespace", work)
            # Pods keep coming until a few are created after gpushare-scheduler's restart (so
            # both its pods place some), at most ``most``.
            most, renew_after, after_restart = 80, 8, 4
            created: list[str] = []
            refused: list[str] = []
            enough = threading.Event()

            def create_pods() -> None:
                for i in range(most):
                    if enough.is_set():
                        return
                    name = f"cert-{i:02d}"
                    manifest = workload_pod(cluster, name, "0.02")
                    out = cluster.kubectl(
                        "create", "-n", work, "-f", "-", input=json.dumps(manifest), check=False
                    )
                    (created if name in out else refused).append(name)
                    time.sleep(0.5)

            creator = threading.Thread(target=create_pods, daemon=True)
            creator.start()
            wait_for(lambda: len(created) + len(refused) >= renew_after, timeout_s=120, what="pods")
            for suffix in LEAVES:
                cluster.kubectl(
                    "annotate", "secret", "-n", NAMESPACE, f"{CONTROLLER}-{suffix}",
                    f"{RENEW_ANNOTATION}=now",
                )  # fmt: skip
            wait_for(
                lambda: all(secret(cluster, s)["data"]["tls.crt"] != before[s] for s in LEAVES),
                timeout_s=60,
                what="the three certificates renewed",
            )
            try:
                restarted = wait_for(
                    lambda: (
                        scheduler_credentials(cluster) != credentials
                        and settled_scheduler(cluster) not in (None, first)
                    ),
                    timeout_s=180,
                    what="gpushare-scheduler restarted with its new client certificate",
                )
            except AssertionError:
                print(state(cluster))
                raise
            # Every replica reloads the webhook's certificate, the leader the extender's,
            # when the kubelet refreshes the mounted Secrets; pods keep coming meanwhile.
            wait_for(
                lambda: reloaded(controller_logs(cluster)),
                timeout_s=180,
                what="the controllers to reload their certificates",
            )
            so_far = len(created) + len(refused)
            wait_for(
                lambda: len(created) + len(refused) >= min(most, so_far + after_restart),
                timeout_s=60,
                what="pods created after the restart",
            )
            enough.set()
            creator.join(timeout=300)

            def all_running() -> bool:
                got = kjson(cluster, "get", "pods", "-n", work)["items"]
                return len(got) == len(created) and all(
                    p["status"].get("phase") == "Running" for p in got
                )

            running = wait_for(all_running, timeout_s=240, what="every created pod Running")
            events = kjson(cluster, "get", "events", "-n", work)["items"]
            # The chart's scheduler pods report as gpushare-scheduler-<pod>; the harness's
            # host-process one (told to stand aside, exclusive_node) fails every pod first.
            chart_scheduler = f"{SCHEDULER}-{SCHEDULER}-"
            # Not a failed bind: kube-scheduler found the pod already in its cache (bound by
            # the leader before it, seen once under a loaded full run); every pod is bound and
            # Running (above).
            handover = "is in the cache, so can't be assumed"
            failed_binds = [
                e["message"]
                for e in events
                if e.get("reason") == "FailedScheduling"
                and str(e.get("reportingInstance", "")).startswith(chart_scheduler)
                and handover not in str(e.get("message", ""))
            ]
            scheduled_by = {
                e.get("reportingInstance", "") for e in events if e.get("reason") == "Scheduled"
            }
            # The CA stayed: nothing that trusted the old certificates had to change.
            assert base64.b64decode(secret(cluster, "ca")["data"]["tls.crt"]) == ca_pem
            assert base64.b64decode(secret(cluster, "extender-tls")["data"]["ca.crt"]) == ca_pem
            logs = controller_logs(cluster)
            assert restarted and running
            assert not refused, f"admissions refused during the renewal: {refused}"
            assert not failed_binds, failed_binds[:3]
            # Placed by the scheduler pod before the restart and by the one after it.
            assert len([i for i in scheduled_by if i.startswith(chart_scheduler)]) >= 2
            # Every replica serves the renewed webhook certificate; the leader the extender's.
            assert reloaded(logs), logs[-3000:]
        finally:
            cluster.kubectl("delete", "namespace", work, "--wait=false", check=False)
            remove_release(cluster)
        # The Secrets the controller made go with its Deployment.
        check_nothing_left(cluster)
