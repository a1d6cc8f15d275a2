"""docs/coexistence.md "Quickstart on a GPU Operator cluster" works as written (issue #66), on
the DRA-mode local cluster, whose containerd 2 has CDI on as a GPU Operator >= v25.10 node
does.

The GPU Operator's part is played first: the node carries ``nvidia.com/gpu.deploy.client=true``
(the operator labels its GPU nodes so) and a CDI spec of kind ``nvidia.com/gpu`` in /etc/cdi
names the simulated GPUs by UUID (the container toolkit writes one per node; here each device
injects one environment variable instead of device nodes and libraries). Then each command of
the section runs in bash, in order, with the placeholders filled: ``<gpu-node>`` the node,
``<registry>`` the local image's registry, ``<your CUDA image>`` the cluster's busybox; the
install also gets the local values the section names for a cluster without GPUs. Each must exit
0 and show what its comment lines say (the reading of README.md's commands,
tests/cluster/test_readme.py). Beyond the claims: the pod's container got what the stand-in CDI
device injects for its own GPU, so the kubelet passed on the CDI name of the device plugin's
Allocate answer and containerd applied it.
"""

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpushare.node.gpu.simulated import simulated_uuid
from tests.cluster.test_readme import (
    Command,
    claims,
    commands,
    excerpt_pattern,
    section,
    sh_blocks,
)
from tests.fixtures.chart_release import exclusive_node, kjson, remove_release
from tests.fixtures.cluster import REPO, LocalCluster
from tests.fixtures.dra import write_standin_nvidia_spec
from tests.fixtures.helm_chart import LOCAL_VALUES, helm_binary

pytestmark = [pytest.mark.cluster, pytest.mark.whole_node]

DOC = REPO / "docs" / "coexistence.md"
HEADING = "## Quickstart on a GPU Operator cluster"
SPEC = Path("/etc/cdi/gpushare-test-nvidia-toolkit.yaml")
CLIENT = "nvidia.com/gpu.deploy.client"


def quickstart() -> list[Command]:
    found = [
        c
        for block in sh_blocks(section(DOC.read_text(), HEADING))
        for c in commands(block, "coexistence.md")
    ]
    assert len(found) >= 6, found
    return found


@pytest.fixture
def operator_node(dra_cluster: LocalCluster) -> Iterator[dict[str, str]]:
    """The node as the GPU Operator leaves it: labelled a GPU client node, with the toolkit's
    CDI spec; GPU UUID -> what its CDI device injects."""
    c = dra_cluster
    uuids = [simulated_uuid(c.node_name, i) for i in range(2)]
    marks = write_standin_nvidia_spec(SPEC, uuids, "toolkit")
    c.kubectl("label", "node", c.node_name, f"{CLIENT}=true", "--overwrite")
    try:
        yield marks
    finally:
        SPEC.unlink(missing_ok=True)
        for key in (CLIENT, "gpushare.io/enabled", "nvidia.com/gpu.deploy.device-plugin"):
            c.kubectl("label", "node", c.node_name, f"{key}-", check=False)


def doc_release() -> tuple[str, str]:
    """(release, namespace) the quickstart's ``helm install`` names."""
    install = next(c.text for c in quickstart() if c.text.startswith("helm install"))
    found = re.match(r"helm install (\S+) .*?--namespace (\S+)", " ".join(install.split()))
    assert found, install
    return found[1], found[2]


def remove_doc_release(c: LocalCluster, helm: str, env: dict[str, str]) -> None:
    """Uninstall the quickstart's release (another release and namespace than the chart
    tests'): left behind, its cluster-wide objects (PriorityClass, admission policies) would
    refuse the next chart test's install and its pods' pause requests."""
    release, namespace = doc_release()
    subprocess.run(
        [helm, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "5m"],
        env=env, capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    c.kubectl(
        "delete", "mutatingwebhookconfigurations,validatingwebhookconfigurations", "-l",
        f"app.kubernetes.io/instance={release}", "--ignore-not-found", check=False,
    )  # fmt: skip
    c.kubectl(
        "delete", "namespace", namespace, "--ignore-not-found", "--wait=true", "--timeout=180s",
        check=False,
    )  # fmt: skip


def filled(text: str, node: str, image: str) -> str:
    text = text.replace("<gpu-node>", node).replace("<registry>", "gpushare")
    text = text.replace("<your CUDA image>", image)
    if text.startswith("helm install"):
        text = text.replace(
            "--set image.repository", f"--values {LOCAL_VALUES} --set image.repository"
        )
    assert "<" not in text.replace("<<", ""), f"a placeholder left: {text}"
    return text


def test_the_gpu_operator_quickstart_runs_as_written_on_a_cdi_node(
    dra_cluster: LocalCluster, images: None, operator_node: dict[str, str]
) -> None:
    c = dra_cluster
    helm = helm_binary()
    assert helm is not None, "helm not found: hack/build-tools.sh helm"
    shell_env = {**c.env, "PATH": f"{Path(helm).parent}:{c.env.get('PATH', '')}"}
    with exclusive_node(c):
        remove_release(c)
        remove_doc_release(c, helm, shell_env)
        try:
            for command in quickstart():
                text = filled(command.text, c.node_name, c.busybox_image)
                proc = subprocess.run(
                    ["bash", "-o", "pipefail", "-c", text],
                    cwd=REPO,
                    env=shell_env,
                    capture_output=True,
                    text=True,
                    timeout=420,
                    check=False,
                )
                out = proc.stdout + proc.stderr
                assert proc.returncode == 0, f"{text}\nexit {proc.returncode}:\n{out}"
                for excerpt in claims(command):
                    assert excerpt_pattern(excerpt).search(out), (
                        f"{text}\nshows no {excerpt!r}:\n{out}"
                    )
            pod = kjson(c, "get", "pod", "cuda-share", "-n", "default")
            env = dict(
                line.split("=", 1)
                for line in c.kubectl(
                    "exec", "cuda-share", "-n", "default", "--", "env"
                ).splitlines()
                if "=" in line
            )
            gpu = pod["metadata"]["annotations"]["gpushare.io/gpu-uuid"]
            assert env.get("STANDIN_NVIDIA_GPU") == operator_node[gpu], env
        finally:
            c.kubectl("delete", "pod", "cuda-share", "-n", "default", "--now", check=False)
            remove_doc_release(c, helm, shell_env)
            remove_release(c)
