"""The README works as written: `make demo`'s cluster, then every command of the README's "Try
it on the demo cluster", of its quickstart and of examples/README.md, run exactly as written.

The commands are read out of the two files, so the docs and this test cannot drift. In each
``sh`` block of those sections a command is a line with its ``\\`` continuations and its
heredoc; the full comment lines right under a command say what it shows: excerpts of its output
separated by ", ", where ``...`` stands for anything and words in parentheses only explain.
Every command runs, in order, in one bash started like a user's shell in the checkout (no
KUBECONFIG, no cluster binaries or .venv on PATH: the README's own lines set them up), and must
exit 0 and show every excerpt. The only commands not run are those naming a ``<placeholder>``
of the reader's own cluster: they may appear only in quickstart step 1, whose install the demo
does itself (and this test checks it does it with the same chart, release and namespace).

Beyond what the docs claim, a user would notice: that the demo's pods, the quickstart's pod
and the examples are placed by the chart's one gpushare-scheduler (no "connection refused"
event from a second one, #49), that a pod alone on its GPU runs with a thread cap of 100, and
that the examples' pods get the CUDA settings of their placement. The examples' images are the
demo's stand-ins (hack/images/stand-in), which say so in their logs.
"""

import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.names import ANN_CLASS, ANN_FRACTION, ANN_GPU_UUID, ANN_STATE, ANN_THREAD_PERCENT
from tests.fixtures.chart_release import (
    check_nothing_left,
    diagnostics,
    exclusive_node,
    kjson,
    remove_release,
    wait_for,
)
from tests.fixtures.cluster import REPO, LocalCluster
from tests.fixtures.doc_commands import (
    Command,
    claims,
    commands,
    excerpt_pattern,
    section,
    sh_blocks,
)
from tests.fixtures.doc_commands import Shell as DocShell

# The demo installs the chart and takes the node over: run before host agents and controllers.
pytestmark = [pytest.mark.cluster, pytest.mark.whole_node]

README = REPO / "README.md"
EXAMPLES_README = REPO / "examples" / "README.md"
DEMO_NAMESPACE = "gpushare-demo"
SYSTEM_NAMESPACE = "gpushare-system"
EXAMPLES_NAMESPACE = "gpushare-examples"
HOST_SCHEDULER = "GPUSHARE_HOST_SCHEDULER"
PLACEHOLDER = re.compile(r"<[a-z][a-z -]*>")


# ---- reading the docs --------------------------------------------------------------------------


def doc_commands() -> list[Command]:
    readme = README.read_text()
    parts = [
        ("README, Try it on the demo cluster", section(readme, "### Try it on the demo cluster")),
        ("README, Quickstart", section(readme, "## Quickstart: install on your cluster")),
        ("examples/README.md", EXAMPLES_README.read_text()),
    ]
    found = [
        c for where, text in parts for block in sh_blocks(text) for c in commands(block, where)
    ]
    assert len(found) > 10, f"too few commands found in the docs: {found}"
    return found


def test_doc_commands_are_read_as_written() -> None:
    """The reader above finds what a person reads: continuations, heredocs, claims."""
    found = doc_commands()
    texts = [c.text for c in found]
    assert any(t.startswith('eval "$(hack/local-cluster.sh env)"') for t in texts), texts
    apply = next(c for c in found if c.text.startswith("kubectl apply -f - <<'EOF'"))
    assert apply.text.endswith("EOF") and "name: train-small" in apply.text
    assert apply.shows == ["pod/train-small created"]
    install = next(c for c in found if c.text.startswith("helm install"))
    assert "--set image.repository=<registry>/gpushare" in install.text
    env = next(c for c in found if "-- env" in c.text)
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100" in claims(env)
    assert excerpt_pattern("CUDA_VISIBLE_DEVICES=GPU-...").search("CUDA_VISIBLE_DEVICES=GPU-1234")
    assert excerpt_pattern("ns  pod  25%").search("ns     pod 25%")
    assert not excerpt_pattern("a  b").search("a\nb")


# ---- a user's shell ----------------------------------------------------------------------------


class Shell(DocShell):
    """One bash in the checkout, as a user's: no KUBECONFIG, and the README's lines put kubectl,
    helm and the plugin on PATH (the Makefile puts .venv/bin there for the tests)."""

    def __init__(self, workdir: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", HOST_SCHEDULER)}
        venv = str(REPO / ".venv" / "bin")
        env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":") if p and p != venv)
        super().__init__(workdir, cwd=REPO, env=env)


# ---- the demo ----------------------------------------------------------------------------------


def cluster_events(cluster: LocalCluster) -> list[dict[str, Any]]:
    return kjson(cluster, "get", "events", "-A")["items"]  # type: ignore[no-any-return]


def remove_demo(cluster: LocalCluster) -> None:
    """What the README says removes the demo, then the examples and quickstart's leftovers."""
    # Both at once: kube-controller-manager starts on each only 5 s after its deletion.
    cluster.kubectl(
        "delete", "namespace", EXAMPLES_NAMESPACE, DEMO_NAMESPACE, "--ignore-not-found",
        "--wait=true", check=False,
    )  # fmt: skip
    cluster.kubectl("delete", "pod", "train-small", "--ignore-not-found", check=False)
    subprocess.run(
        ["helm", "uninstall", "gpushare", "-n", SYSTEM_NAMESPACE, "--wait", "--timeout", "5m"],
        capture_output=True, text=True, env=cluster.env, timeout=400, check=False,
    )  # fmt: skip
    remove_release(cluster)
    cluster.kubectl(
        "delete", "namespace", SYSTEM_NAMESPACE, "--ignore-not-found", "--wait=true", check=False
    )


@pytest.fixture(scope="module")
def demo(cluster: LocalCluster) -> Iterator[str]:
    """`hack/demo.sh` (what `make demo` runs once its tools are built) on the session's cluster;
    afterwards the demo removed and the harness's host gpushare-scheduler started again."""
    with exclusive_node(cluster):
        remove_release(cluster)
        # An earlier run's demo namespace may still be terminating (remove_demo does not wait).
        wait_for(
            lambda: "Terminating"
            not in cluster.kubectl(
                "get", "namespace", SYSTEM_NAMESPACE, "--ignore-not-found",
                "-o", "jsonpath={.status.phase}",
            ),
            timeout_s=120,
            what=f"namespace {SYSTEM_NAMESPACE} to finish terminating",
        )  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != HOST_SCHEDULER}
        try:
            proc = subprocess.run(
                ["bash", str(REPO / "hack" / "demo.sh")],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=1500, check=False,
            )  # fmt: skip
            if proc.returncode != 0:
                pytest.fail(f"hack/demo.sh failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
            yield proc.stdout
        except BaseException:
            print(diagnostics(cluster))
            raise
        finally:
            remove_demo(cluster)
            cluster.harness("up")  # the host gpushare-scheduler the other tests use
        check_nothing_left(cluster)


def pods(cluster: LocalCluster, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    args = ["get", "pods", "-n", namespace] + (["-l", selector] if selector else [])
    return kjson(cluster, *args)["items"]  # type: ignore[no-any-return]


def chart_scheduler_instance(cluster: LocalCluster) -> str:
    (scheduler,) = pods(cluster, SYSTEM_NAMESPACE, "app.kubernetes.io/component=scheduler")
    return f"gpushare-scheduler-{scheduler['metadata']['name']}"


def check_placed_by_the_chart(cluster: LocalCluster, namespace: str, name: str) -> dict[str, str]:
    """Placed on a GPU by the chart's scheduler pod, its container seeing that placement."""
    pod = kjson(cluster, "get", "pod", "-n", namespace, name)
    ann: dict[str, str] = pod["metadata"]["annotations"]
    assert pod["spec"]["schedulerName"] == "gpushare-scheduler", "the webhook sets the scheduler"
    assert ann[ANN_STATE] == "allocated", ann
    assert int(ann[ANN_THREAD_PERCENT]) >= round(float(ann[ANN_FRACTION]) * 100), ann
    events = cluster.events(namespace, name=name, reason="Scheduled")
    assert [e.get("reportingInstance") for e in events] == [chart_scheduler_instance(cluster)]
    return ann


def check_demo_cluster(cluster: LocalCluster, demo_output: str) -> None:
    """One gpushare-scheduler, the demo's pods on one GPU of four, no scheduling errors."""
    status = cluster.harness("status")
    assert re.search(r"gpushare-scheduler\s+not run here", status), status
    assert "gpushare.io/gpu-fraction=0.5, class=batch" in demo_output
    assert "kubectl gpushare top" in demo_output and "NODE gpushare-dev" in demo_output
    gpus = {check_placed_by_the_chart(cluster, DEMO_NAMESPACE, p["metadata"]["name"])[ANN_GPU_UUID]
            for p in pods(cluster, DEMO_NAMESPACE)}  # fmt: skip
    assert len(gpus) == 1, f"the demo's pods take one GPU, not {gpus}"
    assert (
        'helm upgrade --install gpushare ./helm/gpushare --namespace "$NAMESPACE"'
        in (REPO / "hack" / "demo.sh").read_text()
    ), "the demo installs what quickstart step 1 installs"


def check_no_refused_scheduling(cluster: LocalCluster) -> None:
    refused = [
        f"{e['involvedObject'].get('namespace')}/{e['involvedObject']['name']}: {e['message']}"
        for e in cluster_events(cluster)
        if e.get("reason") == "FailedScheduling" and "connection refused" in e.get("message", "")
    ]
    assert not refused, f"a second gpushare-scheduler without its extender: {refused}"


def check_examples_placed(cluster: LocalCluster) -> None:
    """The examples at work: the inference replicas a quarter of a GPU each, latency
    class; the training Job's GpuShare accepted, its pod profiled and given half a GPU; each
    container given the GPU and thread cap of its placement (the stand-in prints them)."""
    serving = pods(cluster, EXAMPLES_NAMESPACE, "app=infer")
    assert len(serving) == 2
    (trainer,) = pods(cluster, EXAMPLES_NAMESPACE, "app=trainer")
    for pod, fraction in [(p, "0.25") for p in serving] + [(trainer, "0.5")]:
        name = pod["metadata"]["name"]
        ann = check_placed_by_the_chart(cluster, EXAMPLES_NAMESPACE, name)
        assert ann[ANN_FRACTION] == fraction, ann
        logs = cluster.kubectl("logs", "-n", EXAMPLES_NAMESPACE, name)
        assert "stand-in for the PyTorch image" in logs, logs
        assert f"GPU {ann[ANN_GPU_UUID]} MPS threads {ann[ANN_THREAD_PERCENT]}" in logs, logs
    assert all(p["metadata"]["annotations"][ANN_CLASS] == "latency" for p in serving)
    assert trainer["metadata"]["annotations"].get("gpushare.io/profiling") in ("true", "done")
    share = kjson(cluster, "get", "gpushare", "trainer", "-n", EXAMPLES_NAMESPACE)["status"]
    conditions = {c["type"]: c["status"] for c in share.get("conditions", [])}
    assert conditions.get("Accepted") == "True", share
    endpoints = kjson(cluster, "get", "endpoints", "infer", "-n", EXAMPLES_NAMESPACE)
    assert sum(len(s.get("addresses", [])) for s in endpoints["subsets"]) == 2


def test_the_readme_and_examples_run_as_written_on_the_demo_cluster(
    cluster: LocalCluster, demo: str
) -> None:
    check_demo_cluster(cluster, demo)
    found = doc_commands()
    with tempfile.TemporaryDirectory() as tmp:
        shell = Shell(Path(tmp))
        ran = []
        try:
            for command in found:
                if PLACEHOLDER.search(command.text):
                    assert command.where == "README, Quickstart", command
                    assert "gpushare-system" in command.text or "label node" in command.text
                    continue
                if command.text.startswith("kubectl delete pod train-small"):
                    env = check_placed_by_the_chart(cluster, "default", "train-small")
                    assert env[ANN_THREAD_PERCENT] == "100", "alone on its GPU: all of it"
                if command.text == "kubectl delete -f examples/":
                    check_examples_placed(cluster)
                rc, output = shell.run(command.text)
                ran.append(command.text)
                assert rc == 0, f"{command.where}: exit {rc}:\n{command.text}\n{output}"
                for excerpt in claims(command):
                    assert excerpt_pattern(excerpt).search(output), (
                        f"{command.where}: {command.text!r} does not show {excerpt!r}:\n{output}"
                    )
        except BaseException:
            print(diagnostics(cluster))
            print(cluster.kubectl("get", "all,events", "-A", check=False)[-6000:])
            raise
        finally:
            shell.close()
    assert "kubectl gpushare top" in ran and "kubectl delete -f examples/" in ran
    check_no_refused_scheduling(cluster)
    wait_for(
        lambda: not cluster.kubectl("get", "namespace", EXAMPLES_NAMESPACE, "--ignore-not-found"),
        timeout_s=120,
        what="the examples' namespace gone",
    )
