"""What the gpu_cluster tests share: the cluster hack/gpu-host-e2e.sh brought up, CUDA pods that
run the host's Python, and the record of every check with its measured figure.

The e2e script exports where things are (GPUSHARE_GPU_CLUSTER=1, the backend, the chart's mode,
the pod image, the host Python and the host directories the pods mount); without them these
tests skip, saying what they need. docs/gpu-cluster.md describes the run.
"""

import json
import os
import subprocess
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.names import ANN_CLASS, ANN_FRACTION, ANN_LIMIT, ANN_MEMORY, ANN_NODE_GPUS
from tests.fixtures.chart_release import wait_for as chart_wait_for
from tests.fixtures.node_agent import scraper_token

Obj = dict[str, Any]
WORKER = Path(__file__).with_name("gemm_worker.py")
TEST_NAMESPACE = "gpushare-gpu-e2e"
NOT_HERE = (
    "GPU-CLUSTER TESTS NOT RUN: they need the real-GPU cluster that hack/gpu-host-e2e.sh brings "
    "up on a machine with an NVIDIA GPU (docs/gpu-cluster.md); GPUSHARE_GPU_CLUSTER is not set"
)


@dataclass
class Check:
    name: str
    figure: Any
    target: str
    passed: bool | None
    detail: str = ""


MODES = ("deviceplugin", "dra")
"""The chart's ``mode`` the e2e script installed (``--mode``): tests/gpu_cluster checks the
device plugin, tests/gpu_cluster/dra the DRA driver; each skips on the other's cluster."""


@dataclass
class GpuCluster:
    backend: str
    mode: str
    release_namespace: str
    image: str
    python: str
    host_dirs: list[str]
    ld_library_path: str
    out: Path
    checks: list[Check] = field(default_factory=list)

    @property
    def real_gpu(self) -> bool:
        return self.backend == "nvml"

    def require_mode(self, mode: str) -> None:
        if self.mode != mode:
            pytest.skip(f"checks of {mode} mode; this cluster's chart runs mode {self.mode}")

    def require_gpu(self) -> None:
        if not self.real_gpu:
            pytest.skip(
                f"GPU FIGURES NOT MEASURED: backend {self.backend} is simulated; this rehearsal "
                "checked the plumbing only"
            )

    # ---- kubectl --------------------------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            ["kubectl", *args],
            check=False,
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def kjson(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def pod(self, name: str) -> Obj:
        return self.kjson("get", "pod", "-n", TEST_NAMESPACE, name)  # type: ignore[no-any-return]

    def logs(self, name: str) -> list[Obj]:
        text = self.kubectl("logs", "-n", TEST_NAMESPACE, name, check=False)
        lines = []
        for line in text.splitlines():
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                lines.append({"text": line})
        return lines

    def delete_pods(self, *names: str) -> None:
        if names:
            self.kubectl(
                "delete", "pod", "-n", TEST_NAMESPACE, *names, "--wait=true",
                "--grace-period=5", "--ignore-not-found", check=False,
            )  # fmt: skip

    # ---- pods -----------------------------------------------------------------------------
    def cuda_pod(
        self,
        name: str,
        args: list[str],
        *,
        fraction: str,
        limit: str | None = None,
        memory: str | None = None,
        gpu_class: str | None = None,
        worker: Path = WORKER,
    ) -> Obj:
        """A pod running ``worker`` (gemm_worker.py) with the host's Python (host dirs mounted
        read-only)."""
        ann = {ANN_FRACTION: fraction}
        if limit is not None:
            ann[ANN_LIMIT] = limit
        if memory is not None:
            ann[ANN_MEMORY] = memory
        if gpu_class is not None:
            ann[ANN_CLASS] = gpu_class
        volumes: list[Obj] = [
            {"name": f"host{i}", "hostPath": {"path": d, "type": "Directory"}}
            for i, d in enumerate(self.host_dirs)
        ]
        mounts: list[Obj] = [
            {"name": f"host{i}", "mountPath": d, "readOnly": True}
            for i, d in enumerate(self.host_dirs)
        ]
        if Path("/etc/ld.so.cache").is_file():
            volumes.append(
                {"name": "ldcache", "hostPath": {"path": "/etc/ld.so.cache", "type": "File"}}
            )
            mounts.append({"name": "ldcache", "mountPath": "/etc/ld.so.cache", "readOnly": True})
        env = [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}, {"name": "HOME", "value": "/tmp"}]
        if self.ld_library_path:
            env.append({"name": "LD_LIBRARY_PATH", "value": self.ld_library_path})
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": TEST_NAMESPACE, "annotations": ann},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 5,
                "containers": [
                    {
                        "name": "work",
                        "image": self.image,
                        "imagePullPolicy": "Never",
                        "command": [self.python, "-u", "-c", worker.read_text(), *args],
                        "env": env,
                        "volumeMounts": mounts,
                    }
                ],
                "volumes": volumes,
            },
        }

    def create(self, *pods: Obj) -> None:
        self.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(p) for p in pods))

    def wait_phase(self, names: list[str], phases: set[str], *, timeout_s: float) -> dict[str, Obj]:
        def reached() -> dict[str, Obj] | None:
            pods = {n: self.pod(n) for n in names}
            bad = {
                n: p["status"].get("phase")
                for n, p in pods.items()
                if p["status"].get("phase") == "Failed"
            }
            if bad and "Failed" not in phases:
                raise AssertionError(f"pods failed: {bad}\n{self.describe(names)}")
            return pods if all(p["status"].get("phase") in phases for p in pods.values()) else None

        return wait_for(reached, timeout_s=timeout_s, what=f"{names} {sorted(phases)}",
                        on_timeout=lambda: self.describe(names))  # fmt: skip

    def describe(self, names: list[str]) -> str:
        out = []
        for n in names:
            out.append(
                self.kubectl("describe", "pod", "-n", TEST_NAMESPACE, n, check=False)[-2500:]
            )
            out.append(self.kubectl("logs", "-n", TEST_NAMESPACE, n, "--tail=15", check=False))
        return "\n".join(out)

    # ---- the record -----------------------------------------------------------------------
    def record(
        self, name: str, figure: Any, target: str, passed: bool | None, detail: str = ""
    ) -> None:
        self.checks.append(Check(name, figure, target, passed, detail))
        self.save()

    def save(self) -> None:
        doc = {
            "backend": self.backend,
            "mode": self.mode,
            "machine": machine(self.out),
            "checks": [c.__dict__ for c in self.checks],
        }
        (self.out / "gpu-cluster-checks.json").write_text(json.dumps(doc, indent=2) + "\n")
        (self.out / "gpu-cluster-checks.md").write_text(markdown(doc))


def markdown(doc: Obj) -> str:
    verdict = {True: "yes", False: "**no**", None: "recorded"}
    lines = [
        f"Machine: {doc['machine']}; node agent backend: {doc['backend']}; "
        f"mode: {doc.get('mode', 'deviceplugin')}.",
        "",
        "| check | measured | target | met | note |",
        "|---|---|---|---|---|",
    ]
    for c in doc["checks"]:
        figure = json.dumps(c["figure"]) if not isinstance(c["figure"], str) else c["figure"]
        lines.append(
            f"| {c['name']} | {figure} | {c['target']} | {verdict[c['passed']]} | {c['detail']} |"
        )
    return "\n".join(lines) + "\n"


def machine(out: Path) -> str:
    csv = out / "nvidia-smi.csv"
    if csv.is_file():
        rows = csv.read_text().strip().splitlines()[1:]
        return "; ".join(r.strip() for r in rows)
    return "no GPU (simulated backend)"


def wait_for(
    check: Callable[[], Any],
    *,
    timeout_s: float,
    what: str,
    on_timeout: Callable[[], str] | None = None,
) -> Any:
    """chart_release.wait_for, adding what ``on_timeout`` says (pod events, logs) on failure."""
    try:
        return chart_wait_for(check, timeout_s=timeout_s, what=what)
    except AssertionError as exc:
        if on_timeout is None:
            raise
        raise AssertionError(f"{exc}\n{on_timeout()}") from None


def from_env() -> GpuCluster:
    if os.environ.get("GPUSHARE_GPU_CLUSTER") != "1":
        pytest.skip(NOT_HERE)
    out = Path(os.environ.get("GPUSHARE_GPU_CLUSTER_OUT", "gpu-cluster-out"))
    out.mkdir(parents=True, exist_ok=True)
    mode = os.environ.get("GPUSHARE_GPU_CLUSTER_MODE", "deviceplugin")
    if mode not in MODES:
        pytest.fail(f"GPUSHARE_GPU_CLUSTER_MODE={mode!r}: use one of {', '.join(MODES)}")
    return GpuCluster(
        backend=os.environ["GPUSHARE_GPU_CLUSTER_BACKEND"],
        mode=mode,
        release_namespace=os.environ.get("GPUSHARE_RELEASE_NAMESPACE", "gpushare"),
        image=os.environ["GPUSHARE_POD_IMAGE"],
        python=os.environ["GPUSHARE_POD_PYTHON"],
        host_dirs=[d for d in os.environ["GPUSHARE_POD_HOST_DIRS"].split(":") if d],
        ld_library_path=os.environ.get("GPUSHARE_POD_LD_LIBRARY_PATH", ""),
        out=out,
    )


METRICS_PORT = 9445
"""The node agent's metrics port in the chart's local-cluster values."""


def agent_pod(gc: GpuCluster) -> Obj:
    pods = gc.kjson(
        "get", "pods", "-n", gc.release_namespace, "-l", "app.kubernetes.io/component=node-agent"
    )["items"]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]  # type: ignore[no-any-return]


def exporter_text(gc: GpuCluster) -> str:
    ip = agent_pod(gc)["status"]["podIP"]
    request = urllib.request.Request(
        f"http://{ip}:{METRICS_PORT}/metrics",
        headers={"Authorization": f"Bearer {scraper_token(gc)}"},  # as Prometheus scrapes
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return resp.read().decode()  # type: ignore[no-any-return]


def node_gpus(gc: GpuCluster) -> list[str]:
    node = gc.kjson("get", "nodes")["items"][0]
    return sorted(g["uuid"] for g in json.loads(node["metadata"]["annotations"][ANN_NODE_GPUS]))
