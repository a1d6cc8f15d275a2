"""The Helm chart end to end on the local cluster, with the image built from the Dockerfile.

`hack/build-image.sh` builds the project's Dockerfile offline (buildah) and assembles the
kube-scheduler image from the harness's binary; both are imported into the cluster's
containerd under the names the chart uses. Then, as a user would:

helm install -> every gpushare pod Ready -> annotated pods placed by the chart's
gpushare-scheduler onto simulated GPUs, with their GPU's environment inside the container ->
the node agent's pod deleted: they keep running, same container and placement ->
helm upgrade with changed values (and a calibrated interference model from a ConfigMap) rolls
cleanly -> helm uninstall leaves no gpushare object,
socket, MPS directory or node label behind.

The shared pieces (the release, the image build, exclusive use of the node, placing pods,
checking that nothing is left) live in tests/fixtures/chart_release.py.

`test_service_accounts_can_do_exactly_what_they_need` needs none of that: it applies only
the chart's RBAC under a throwaway release and asks `kubectl auth can-i`.
"""

import json
import re
import subprocess
import uuid

import pytest
import yaml

from bench.gpu.fitting import observations, parse_records
from gpushare.api.inventory import load_inventory
from gpushare.api.names import ANN_NODE_GPUS, LABEL_MPS_CAPABLE, LABEL_SIMULATED
from gpushare.packing.calibration import calibrate
from gpushare.packing.interference import load_default
from tests import REPO
from tests.fixtures.chart_release import (
    CRD,
    NAMESPACE,
    RELEASE,
    Obj,
    allocatable,
    check_nothing_left,
    check_placed,
    component,
    diagnostics,
    exclusive_node,
    helm,
    kjson,
    node,
    place,
    ready,
    release_pods,
    remove_release,
    shares_per_gpu,
    wait_crds_established,
    wait_for,
    wait_ready_release_pods,
    wait_webhook_serving,
)
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.helm_chart import CHART, LOCAL_VALUES, helm_binary

# The chart takes the node over (exclusive_node): run before host agents and controllers start.
pytestmark = [pytest.mark.cluster, pytest.mark.whole_node]


def test_install_place_upgrade_uninstall(cluster: LocalCluster, images: None) -> None:
    work = f"gpushare-e2e-work-{uuid.uuid4().hex[:6]}"
    with exclusive_node(cluster):
        remove_release(cluster)  # what an interrupted earlier run may have left
        try:
            # -- install: every gpushare pod Ready ----------------------------------------
            out = helm(
                cluster,
                "install",
                RELEASE,
                str(CHART),
                "--namespace",
                NAMESPACE,
                "--create-namespace",
                "--values",
                str(LOCAL_VALUES),
                "--wait",
                "--timeout",
                "5m",
            ).stdout
            assert "SIMULATED" in out, "NOTES must say the GPUs are simulated"
            # helm's --wait counts a one-node DaemonSet ready before its pod is (it allows
            # maxUnavailable=1 of 1), so the node agent gets the same 2 minutes to be Ready.
            pods = wait_ready_release_pods(cluster, timeout_s=120)
            wait_webhook_serving(cluster)
            # Two controller replicas: one leads (its pod labelled so, the extender Service
            # selects it), the other serves the webhook as a standby.
            assert sorted(component(p) for p in pods) == [
                "controller",
                "controller",
                "node-agent",
                "scheduler",
            ]
            assert all(ready(p) for p in pods), [p["status"] for p in pods]
            roles = wait_for(
                lambda: (
                    sorted(
                        p["metadata"]["labels"].get("gpushare.io/controller-role", "")
                        for p in release_pods(cluster)
                        if component(p) == "controller"
                    )
                    == ["leader", "standby"]
                ),
                timeout_s=60,
                what="one leader and one standby controller",
            )
            assert roles
            images_used = {c["image"] for p in pods for c in p["spec"]["containers"]}
            assert images_used == {
                "gpushare/gpushare:0.1.0",
                "registry.k8s.io/kube-scheduler:v1.34.4",
            }
            wait_for(lambda: allocatable(cluster) == 200, timeout_s=60, what="200 gpu-percent")
            # -- helm test: a pod asks for a share and checks it got it -------------------
            # The pod's exit code is the verdict; a passing pod is deleted at once (so no
            # --logs: its logs are gone by the time Helm asks).
            tested = helm(cluster, "test", RELEASE, "-n", NAMESPACE, timeout_s=300)
            assert re.search(r"Phase:\s+Succeeded", tested.stdout), tested.stdout
            assert not cluster.kubectl(
                "get", "pod", "gpushare-test-share", "-n", NAMESPACE, "--ignore-not-found"
            ).strip(), "a passing test pod is deleted"
            labels = node(cluster)["metadata"]["labels"]
            assert labels.get(LABEL_SIMULATED) == "true"
            assert labels.get(LABEL_MPS_CAPABLE) == "true"
            gpus = load_inventory(node(cluster)["metadata"]["annotations"][ANN_NODE_GPUS])
            uuids = {g.uuid for g in gpus}
            assert len(uuids) == 2

            # -- annotated pods placed by the chart's scheduler, right env inside -----------
            cluster.kubectl("create", "namespace", work)
            placed = place(cluster, work, {"a": "0.5", "b": "0.25", "c": "0.5", "d": "0.5"})
            check_placed(cluster, work, placed, uuids)
            used = shares_per_gpu(cluster, work, list(placed))
            assert sum(used.values()) == pytest.approx(1.75)

            # -- the node agent's pod deleted: running pods keep container and placement -----
            agent = next(p for p in release_pods(cluster) if component(p) == "node-agent")
            cluster.kubectl("delete", "pod", "-n", NAMESPACE, agent["metadata"]["name"])

            def new_agent_ready() -> bool:
                agents = [p for p in release_pods(cluster) if component(p) == "node-agent"]
                uids = [p["metadata"]["uid"] for p in agents]
                return uids != [agent["metadata"]["uid"]] and len(agents) == 1 and ready(agents[0])

            wait_for(new_agent_ready, timeout_s=120, what="a new node agent pod Ready")
            wait_for(lambda: allocatable(cluster) == 200, timeout_s=60, what="200 gpu-percent")
            for name, pod in placed.items():
                now = kjson(cluster, "get", "pod", "-n", work, name)
                assert now["metadata"]["uid"] == pod["metadata"]["uid"]
                assert now["status"]["phase"] == "Running"
                # The same container, never restarted.
                containers = {c["name"]: c for c in pod["status"]["containerStatuses"]}
                for c in now["status"]["containerStatuses"]:
                    assert c["containerID"] == containers[c["name"]]["containerID"], c
                    assert c["restartCount"] == 0, c
            assert shares_per_gpu(cluster, work, list(placed)) == used

            # -- upgrade with changed values: every component rolls, nothing breaks ----------
            # The documented CRD step first (docs/chart.md, "Upgrade"): Helm never upgrades crds/.
            crds = helm(cluster, "show", "crds", str(CHART)).stdout
            applied = cluster.kubectl(
                "apply", "--server-side", "--force-conflicts", "-f", "-", input=crds
            )
            assert CRD in applied
            before = {component(p): p["metadata"]["uid"] for p in release_pods(cluster)}
            # ... and an interference model calibrated on measured packs, from a ConfigMap
            # (docs/packing.md, "Calibrating on your GPUs").
            cluster.kubectl(
                "apply", "-n", NAMESPACE, "-f", "-", input=yaml.safe_dump(calibrated_model())
            )
            helm(
                cluster,
                "upgrade",
                RELEASE,
                str(CHART),
                "--namespace",
                NAMESPACE,
                "--reuse-values",
                "--set",
                "controller.logLevel=DEBUG",
                "--set",
                "node.logLevel=DEBUG",
                "--set",
                "scheduler.extenderWeight=6",
                "--set",
                f"controller.interferenceModelConfigMap={MODEL_CONFIGMAP}",
                "--wait",
                "--timeout",
                "5m",
            )
            for kind in (
                "deployment/gpushare-controller",
                "deployment/gpushare-scheduler",
                "daemonset/gpushare-node-agent",
            ):
                cluster.kubectl("rollout", "status", "-n", NAMESPACE, kind, "--timeout=120s")

            def all_ready() -> list[Obj] | None:
                pods = release_pods(cluster)
                return pods if len(pods) == 4 and all(ready(p) for p in pods) else None

            after_pods = wait_for(
                all_ready,
                timeout_s=180,
                what="four Ready gpushare pods after the upgrade",
            )
            wait_webhook_serving(cluster)
            after = {component(p): p["metadata"]["uid"] for p in after_pods}
            assert after.keys() == before.keys()
            assert all(after[k] != before[k] for k in before), "every component rolled"
            for pod in after_pods:
                for status in pod["status"]["containerStatuses"]:
                    assert status["restartCount"] == 0, status
            controller = next(p for p in after_pods if component(p) == "controller")
            assert "--log-level=DEBUG" in controller["spec"]["containers"][0]["args"]
            for pod in after_pods:
                if component(pod) == "controller":
                    loaded = model_loaded(cluster, pod["metadata"]["name"])
                    assert loaded["file"] == "/etc/gpushare/interference/interference.json"
                    assert str(loaded["source"]).startswith("calibrated:"), loaded
            history = json.loads(
                helm(cluster, "history", RELEASE, "-n", NAMESPACE, "-o", "json").stdout
            )
            assert [h["status"] for h in history] == ["superseded", "deployed"]
            # Running pods kept their GPUs; a new pod fits into what the restarted controller
            # rebuilt from the placement annotations.
            for name, pod in placed.items():
                now = kjson(cluster, "get", "pod", "-n", work, name)
                assert now["metadata"]["uid"] == pod["metadata"]["uid"]
                assert now["status"]["phase"] == "Running"
            more = place(cluster, work, {"e": "0.25"})
            check_placed(cluster, work, more, uuids)
            used = shares_per_gpu(cluster, work, [*placed, *more])
            assert sum(used.values()) == pytest.approx(2.0)

            # -- uninstall: nothing of gpushare left ----------------------------------------
            cluster.remove_namespace(work)
            helm(
                cluster, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "5m"
            )
            check_nothing_left(cluster)
        except BaseException:
            print(diagnostics(cluster))
            raise
        finally:
            remove_release(cluster)  # quick no-op after a clean uninstall
            cluster.kubectl(
                "delete",
                "namespace",
                work,
                NAMESPACE,
                "--ignore-not-found",
                "--wait=false",
                check=False,
            )


MODEL_CONFIGMAP = "gpushare-interference"


def calibrated_model() -> Obj:
    """A ConfigMap holding the shipped model calibrated on an H200 run's measured packs, as
    ``bench/sim/fit_interference.py --calibrate`` writes it."""
    data = json.loads((REPO / "bench/gpu/data/run13-h200-colocations.json").read_text())
    model = calibrate(load_default(), observations(parse_records(data)))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": MODEL_CONFIGMAP},
        "data": {"interference.json": json.dumps(model.to_dict(), indent=2)},
    }


def model_loaded(cluster: LocalCluster, pod: str) -> dict[str, object]:
    """The controller's ``interference model loaded`` log record (JSON lines)."""
    logs = cluster.kubectl("logs", "-n", NAMESPACE, pod, "-c", "controller")
    for line in logs.splitlines():
        if "interference model loaded" in line:
            record: dict[str, object] = json.loads(line)
            return record
    raise AssertionError(f"{pod} never logged which interference model it loaded:\n{logs}")


# ---- RBAC: kubectl auth can-i per service account -----------------------------------------

RBAC_TEMPLATES = (
    "controller-rbac.yaml",
    "scheduler-rbac.yaml",
    "node-rbac.yaml",
    "uninstall-hook.yaml",
)


def _can(
    cluster: LocalCluster, sa: str, namespace: str, check: tuple[str, str, str | None]
) -> bool:
    verb, what, where = check
    # `what` is resource[/name], optionally followed by " --subresource=<sub>".
    args = ["auth", "can-i", verb, *what.split(), f"--as=system:serviceaccount:{namespace}:{sa}"]
    args += ["-n", where] if where else []
    out = cluster.kubectl(*args, check=False).strip()
    assert out in ("yes", "no"), f"kubectl {' '.join(args)}: {out!r}"
    return out == "yes"


def test_service_accounts_can_do_exactly_what_they_need(cluster: LocalCluster) -> None:
    release = f"rbac-{uuid.uuid4().hex[:6]}"
    ns = release
    full = f"{release}-gpushare"
    binary = helm_binary()
    if binary is None:
        pytest.skip("helm not found: build it with `hack/build-tools.sh helm`")
    cmd = [binary, "template", release, str(CHART), "--namespace", ns, "--kube-version", "1.34.4"]
    for template in RBAC_TEMPLATES:
        cmd += ["--show-only", f"templates/{template}"]
    rendered = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout
    # Only the RBAC objects: the hook Job would run a pod.
    docs = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] != "Job"]
    # `kubectl auth can-i` checks a custom resource's group only when the API server serves it;
    # without the CRD (no install ran first) every GpuShare check would read "no".
    cluster.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        str(CHART / "crds" / "gpushare.io_gpushares.yaml"),
    )
    wait_crds_established(cluster, CRD)
    cluster.kubectl("create", "namespace", ns)
    try:
        cluster.kubectl("apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(d) for d in docs))
        ctl, sch, agent, hook = (
            f"{full}-{c}" for c in ("controller", "scheduler", "node-agent", "uninstall")
        )
        # (service account, verb, resource[/name], namespace or None, expected)
        matrix: list[tuple[str, str, str, str | None, bool]] = [
            # controller: extender, webhook registration, operator
            (ctl, "watch", "pods", None, True),
            (ctl, "patch", "pods", "default", True),
            (ctl, "create", "pods --subresource=binding", "default", True),
            (ctl, "create", "pods --subresource=eviction", "default", True),
            (ctl, "list", "nodes", None, True),
            (ctl, "create", "events", "default", True),
            (ctl, "patch", "gpushares.gpushare.io", "default", True),
            (ctl, "patch", "gpushares.gpushare.io --subresource=status", "default", True),
            (ctl, "list", "customresourcedefinitions.apiextensions.k8s.io", None, True),
            (
                ctl,
                "patch",
                f"mutatingwebhookconfigurations.admissionregistration.k8s.io/{full}",
                None,
                True,
            ),
            (
                ctl,
                "patch",
                f"validatingwebhookconfigurations.admissionregistration.k8s.io/{full}",
                None,
                True,
            ),
            (ctl, "create", "configmaps", ns, True),
            (ctl, "patch", f"configmaps/{full}-profile-cache", ns, True),
            (ctl, "create", "pods", "default", False),
            (ctl, "delete", "pods", "default", False),
            (ctl, "create", "pods --subresource=exec", "default", False),
            (ctl, "patch", "nodes", None, False),
            (ctl, "get", "secrets", ns, False),
            # its certificates: Secrets it creates, then only those by name; the scheduler's
            # Deployment, restarted when its extender CA or client certificate changes
            (ctl, "create", "secrets", ns, True),
            (ctl, "update", f"secrets/{ctl}-extender-client", ns, True),
            (ctl, "get", f"secrets/{ctl}-ca", ns, True),
            (ctl, "get", "secrets/other", ns, False),
            (ctl, "create", "secrets", "default", False),
            (ctl, "patch", f"deployments.apps/{full}-scheduler", ns, True),
            (ctl, "patch", f"deployments.apps/{ctl}", ns, False),
            (ctl, "delete", "gpushares.gpushare.io", "default", False),
            (
                ctl,
                "patch",
                "mutatingwebhookconfigurations.admissionregistration.k8s.io/other",
                None,
                False,
            ),
            (
                ctl,
                "create",
                "mutatingwebhookconfigurations.admissionregistration.k8s.io",
                None,
                False,
            ),
            (ctl, "patch", "configmaps/other", ns, False),
            (ctl, "create", "configmaps", "default", False),
            # leader election between replicas (its own Lease), admin labels on namespaces
            (ctl, "create", "leases.coordination.k8s.io", ns, True),
            (ctl, "update", f"leases.coordination.k8s.io/{ctl}", ns, True),
            (ctl, "update", "leases.coordination.k8s.io/other", ns, False),
            (ctl, "create", "leases.coordination.k8s.io", "default", False),
            (ctl, "watch", "namespaces", None, True),
            (ctl, "patch", "namespaces", None, False),
            # gpushare-scheduler: what kube-scheduler needs, its own lease
            (sch, "create", "pods --subresource=binding", "default", True),
            (sch, "watch", "pods", None, True),
            (sch, "list", "nodes", None, True),
            (sch, "create", "leases.coordination.k8s.io", ns, True),
            (sch, "update", f"leases.coordination.k8s.io/{full}-scheduler", ns, True),
            (sch, "get", "configmaps/extension-apiserver-authentication", "kube-system", True),
            (sch, "update", "leases.coordination.k8s.io/other", ns, False),
            (sch, "get", "secrets", ns, False),
            (sch, "delete", "nodes", None, False),
            (sch, "patch", "gpushares.gpushare.io", "default", False),
            # node agent: pods on its node, its node's metadata, events, its DaemonSet
            (agent, "list", "pods", None, True),
            (agent, "watch", "pods", None, True),  # of its node: the pause loop's wake-up
            (agent, "patch", "pods", "default", True),
            (agent, "patch", "nodes", None, True),
            (agent, "create", "events", "default", True),
            (agent, "get", f"daemonsets.apps/{agent}", ns, True),
            (agent, "create", "pods", "default", False),
            (agent, "delete", "pods", "default", False),
            (agent, "create", "pods --subresource=eviction", "default", False),
            (agent, "create", "pods --subresource=binding", "default", False),
            (agent, "patch", "nodes --subresource=status", None, False),
            (agent, "delete", "nodes", None, False),
            (agent, "get", "secrets", ns, False),
            (agent, "get", "daemonsets.apps/other", ns, False),
            # uninstall hook: delete the agents' DaemonSet, nothing else
            (hook, "delete", f"daemonsets.apps/{agent}", ns, True),
            (hook, "get", f"daemonsets.apps/{agent}", ns, True),
            (hook, "delete", "daemonsets.apps/other", ns, False),
            (hook, "delete", f"deployments.apps/{ctl}", ns, False),
            (hook, "list", "pods", ns, False),
        ]
        wrong = [
            f"{sa.removeprefix(full + '-')} {verb} {what}{' -n ' + where if where else ''}: "
            f"{'no' if expected else 'yes'}, want {'yes' if expected else 'no'}"
            for sa, verb, what, where, expected in matrix
            if _can(cluster, sa, ns, (verb, what, where)) != expected
        ]
        assert not wrong, "\n".join(wrong)
    finally:
        cluster.kubectl(
            "delete",
            "-f",
            "-",
            "--ignore-not-found",
            "--wait=false",
            input="\n---\n".join(yaml.safe_dump(d) for d in docs),
            check=False,
        )
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
