"""docs/operator.md works as written: every command of its ``sh`` blocks runs, in order, on the
local cluster, and shows what the comment lines under it say (the reader and the shell of
tests/cluster/test_readme.py, tests/fixtures/doc_commands.py). A command whose first comment
line starts with "(refused)" must fail and show the refusal. A read (``kubectl get``) is
looked at again for up to 60 s until it shows what the doc says, as a user would: the operator
acts within seconds, not at once.

Beyond the commands, what the page's text promises: the stored profile has the fields of the
page's example, the profiled pod carries the annotations of the extender's table, and the
standalone operator takes every flag the page lists.

The cluster is the shared test cluster: the controller process (webhook, extender) of the test
fixtures, which serves only namespaces carrying its label (added here to ``ml``, which the page
creates), and the standalone operator scoped to ``ml``, as in test_operator_cluster.py.
"""

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpushare.api.gpushare_crd import ANN_PROFILE, ANN_PROFILING
from gpushare.api.names import ANN_CLASS, ANN_MEMORY, ANN_MEMORY_LIMIT, ANN_SHARE
from tests.cluster.test_operator_cluster import (
    CRD,
    OperatorProcess,
    drop_share_finalizers,
    get,
)
from tests.fixtures.cluster import REPO, LocalCluster
from tests.fixtures.controller import ControllerProcess
from tests.fixtures.doc_commands import Command, Shell, claims, commands, excerpt_pattern, sh_blocks
from tests.fixtures.node_agent import NodeAgentProcess

pytestmark = pytest.mark.cluster

DOC = REPO / "docs" / "operator.md"
NAMESPACE = "ml"
DOC_IMAGE = "docker.io/library/busybox:1.36"
"""The image the page's pods run (``busybox:1.36``), tagged here from the cluster's own busybox:
the local cluster reaches no registry."""
REREAD_S = 60.0


def doc_commands() -> list[Command]:
    found = [c for block in sh_blocks(DOC.read_text()) for c in commands(block, "operator.md")]
    assert len(found) >= 15, f"too few commands found in docs/operator.md: {found}"
    return found


def refused(command: Command) -> bool:
    return bool(command.shows) and command.shows[0].startswith("(refused)")


def test_the_pages_commands_are_read_as_written() -> None:
    found = doc_commands()
    assert found[0].text == "kubectl create namespace ml"
    assert found[-1].text == "kubectl delete namespace ml"
    apply = next(c for c in found if "name: trainer, namespace: ml" in c.text)
    assert apply.text.endswith("EOF") and apply.shows == ["gpushare.gpushare.io/trainer created"]
    bad = [c for c in found if refused(c)]
    assert len(bad) == 5, bad
    assert any("spec.fraction is required" in " ".join(c.shows) for c in bad)


def tag_doc_image(cluster: LocalCluster) -> None:
    ctr = [
        "ctr", "--address", str(cluster.state_dir / "run" / "containerd.sock"), "-n", "k8s.io",
        "images", "tag", "--force", cluster.busybox_image, DOC_IMAGE,
    ]  # fmt: skip
    subprocess.run(ctr, capture_output=True, text=True, timeout=60, check=True)


def remove_ml(cluster: LocalCluster) -> None:
    drop_share_finalizers(cluster, NAMESPACE)
    cluster.remove_namespace(NAMESPACE)


@pytest.fixture
def fresh_ml(cluster: LocalCluster, controller: ControllerProcess) -> Iterator[None]:
    """No namespace ``ml`` before (an earlier run's), none after."""
    cluster.kubectl("apply", "-f", str(CRD))
    cluster.kubectl("wait", "--for", "condition=established", "crd/gpushares.gpushare.io")
    remove_ml(cluster)
    tag_doc_image(cluster)
    yield
    remove_ml(cluster)


def user_env(cluster: LocalCluster) -> dict[str, str]:
    """The cluster's kubeconfig and tools, and the kubectl plugin on PATH (a user who installed
    it)."""
    env = dict(cluster.env)
    env["PATH"] = f"{REPO / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_as_written(shell: Shell, command: Command) -> str:
    """Run ``command``; it must succeed (fail, if the page says it is refused) and show every
    excerpt. Reads are run again until they do, for up to REREAD_S."""
    deadline = time.monotonic() + (REREAD_S if command.text.startswith("kubectl get ") else 0)
    while True:
        rc, output = shell.run(command.text)
        ok = (rc != 0) if refused(command) else (rc == 0)
        missing = [e for e in claims(command) if not excerpt_pattern(e).search(output)]
        if ok and not missing:
            return output
        if time.monotonic() >= deadline:
            break
        time.sleep(2)
    expected = "a refusal" if refused(command) else "success"
    assert ok, f"exit {rc} where the page shows {expected}:\n{command.text}\n{output}"
    raise AssertionError(f"{command.text!r} does not show {missing[0]!r}:\n{output}")


def doc_profile_fields() -> set[str]:
    """The fields of the page's example of a stored profile."""
    block = DOC.read_text().split("A stored profile", 1)[1]
    text = re.search(r"```yaml\n(.*?)```", block, re.DOTALL)
    assert text, "the stored profile example is gone from docs/operator.md"
    return set(yaml.safe_load(text.group(1))["profile"])


def check_what_the_text_promises(cluster: LocalCluster) -> None:
    """Before the page removes it all: the profile, the profiled pod's annotations."""
    status = get(cluster, "gpushare", "trainer", NAMESPACE)["status"]
    assert status["phase"] == "Packed"
    assert set(status["profile"]) == doc_profile_fields()
    ann = get(cluster, "pod", "trainer-0", NAMESPACE)["metadata"]["annotations"]
    assert ann[ANN_PROFILING] == "done"  # the extender's table: true, then done
    assert json.loads(ann[ANN_PROFILE]).keys() == status["profile"].keys()
    assert (ann[ANN_SHARE], ann[ANN_MEMORY], ann[ANN_CLASS]) == ("trainer", "10Gi", "batch")
    assert int(ann[ANN_MEMORY_LIMIT]) == 10 * 2**30
    for key in ("gpushare.io/packing-policy", "gpushare.io/max-pods-per-gpu"):
        assert key in ann, key
    reported = cluster.events(NAMESPACE, name="web-0", reason="SelectorNotLinked")
    assert reported, "the pod made before the share is reported on itself too"


def test_the_standalone_operator_takes_every_flag_the_page_lists() -> None:
    text = DOC.read_text().split("## Running it", 1)[1].split("\n## ", 1)[0]
    flags = set(re.findall(r"(--[a-z][a-z-]+)", text))
    assert {"--namespace", "--agent-url", "--dra", "--profiling-warmup"} <= flags
    out = subprocess.run(
        [sys.executable, "-m", "tests.fixtures.standalone_operator", "--help"],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert not {f for f in flags if f not in out}, out


def test_every_example_of_the_operator_page_runs_as_written(
    cluster: LocalCluster,
    controller: ControllerProcess,
    node_agent: NodeAgentProcess,
    fresh_ml: None,
    tmp_path: Path,
) -> None:
    operator = OperatorProcess(
        cluster=cluster,
        namespace=NAMESPACE,
        agent_url=f"http://127.0.0.1:{node_agent.metrics_port}",
        log_path=tmp_path / "operator.log",
        args=["--no-protection"],
    )
    shell = Shell(tmp_path, cwd=REPO, env=user_env(cluster))
    ran: list[str] = []
    try:
        for command in doc_commands():
            if command.text.startswith("kubectl delete gpushares"):
                check_what_the_text_promises(cluster)
            run_as_written(shell, command)
            ran.append(command.text)
            if command.text == "kubectl create namespace ml":
                # The test controller's webhook serves only namespaces with its label; the
                # page's operator runs scoped to the namespace.
                cluster.kubectl("label", "namespace", NAMESPACE, controller.namespace_label)
                operator.start()
    except BaseException:
        print(operator.log_text()[-4000:])
        print(cluster.kubectl("get", "pods,gpushares,events", "-n", NAMESPACE, check=False))
        raise
    finally:
        shell.close()
        if operator.proc is not None:
            operator.stop()
    assert ran[-1] == "kubectl delete namespace ml"
