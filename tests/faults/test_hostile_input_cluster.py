"""Hostile input against the real API server: pods that try to lift or steal a GPU share are
refused by gpushare's webhook with the field and the fix, and leave nothing behind; random
GpuShare objects get a 4xx with a reason or are stored, never a server error.

(tests/cluster/test_scheduling_extender.py covers invalid requests: bad fractions, too much
memory, whole NVIDIA GPUs; this file covers the ways around a share.)
"""

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare.api.errors import InvalidInputError
from gpushare.api.gpushare_crd import parse_spec
from gpushare.api.inventory import load_inventory
from gpushare.api.names import (
    ANN_BIND_TIME,
    ANN_FRACTION,
    ANN_GPU_UUID,
    ANN_NODE_GPUS,
    ANN_STATE,
    ANN_THREAD_PERCENT,
)
from tests.faults.cluster_checks import kubectl_json
from tests.fixtures.controller import ControllerProcess, served_namespace

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "gpushare.io_gpushares.yaml"
STATS: dict[str, int] = {"cases": 0, "crashes": 0, "accepted": 0, "refused": 0, "disagreements": 0}


def run_kubectl(cluster: Any, *args: str, input: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", *args],
        input=input,
        capture_output=True,
        text=True,
        env=cluster.env,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def namespace(cluster: Any, controller: ControllerProcess) -> Iterator[str]:
    with served_namespace(cluster, controller, "gs-hostile") as name:
        cluster.kubectl(
            "create", "configmap", "cuda-overrides", "-n", name,
            "--from-literal=CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=999999M",
            "--from-literal=CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100",
        )  # fmt: skip
        yield name


def hostile_pod(cluster: Any, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {ANN_FRACTION: "0.25"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": cluster.busybox_image,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                }
            ],
        },
    }


def another_pods_gpu(cluster: Any) -> str:
    node = kubectl_json(cluster, "get", "node", cluster.node_name)
    return load_inventory(node["metadata"]["annotations"][ANN_NODE_GPUS])[0].uuid


def _env(name: str, value: str = "100") -> Any:
    return lambda pod: (
        pod["spec"]["containers"][0].setdefault("env", []).append({"name": name, "value": value})
    )


def _init_env(pod: dict[str, Any]) -> None:
    init = dict(pod["spec"]["containers"][0], name="setup", command=["true"])
    init["env"] = [{"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=999999M"}]
    pod["spec"]["initContainers"] = [init]


def _env_from(prefix: str | None) -> Any:
    def apply(pod: dict[str, Any]) -> None:
        source: dict[str, Any] = {"configMapRef": {"name": "cuda-overrides"}}
        if prefix is not None:
            source["prefix"] = prefix
        pod["spec"]["containers"][0]["envFrom"] = [source]

    return apply


def _host_path(path: str) -> Any:
    def apply(pod: dict[str, Any]) -> None:
        pod["spec"]["volumes"] = [{"name": "h", "hostPath": {"path": path}}]
        pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "h", "mountPath": "/h"}]

    return apply


def _annotation(key: str, value: str) -> Any:
    return lambda pod: pod["metadata"]["annotations"].__setitem__(key, value)


HOSTILE = {
    "env lifts the thread cap": (
        _env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
        "spec.containers[0].env[0] (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)",
    ),
    "env lifts the memory cap": (
        _env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=999999M"),
        "spec.containers[0].env[0] (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)",
    ),
    "env picks another GPU": (
        _env("CUDA_VISIBLE_DEVICES", "GPU-0"),
        "spec.containers[0].env[0] (CUDA_VISIBLE_DEVICES)",
    ),
    "env picks NVIDIA devices": (
        _env("NVIDIA_VISIBLE_DEVICES", "all"),
        "spec.containers[0].env[0] (NVIDIA_VISIBLE_DEVICES)",
    ),
    "env talks to another MPS pipe": (
        _env("CUDA_MPS_PIPE_DIRECTORY", "/tmp/other"),
        "spec.containers[0].env[0] (CUDA_MPS_PIPE_DIRECTORY)",
    ),
    "init container sets it": (_init_env, "spec.initContainers[0].env[0]"),
    "envFrom a ConfigMap": (_env_from(None), "spec.containers[0].envFrom[0]"),
    "envFrom with a CUDA_ prefix": (_env_from("CUDA_"), "spec.containers[0].envFrom[0]"),
    "mounts the MPS directories": (
        _host_path("/run/gpushare/node/mps"),
        "spec.volumes[0].hostPath.path",
    ),
    "mounts them by a detour": (
        _host_path("/run/../run/gpushare//mps/"),
        "spec.volumes[0].hostPath.path",
    ),
    "mounts the device-plugin sockets": (
        _host_path("/var/lib/kubelet/device-plugins"),
        "spec.volumes[0].hostPath.path",
    ),
    "mounts the pod-resources socket": (
        _host_path("/var/lib/kubelet/pod-resources/kubelet.sock"),
        "spec.volumes[0].hostPath.path",
    ),
    "mounts the host root": (_host_path("/"), "spec.volumes[0].hostPath.path"),
    "names another pod's GPU": (
        lambda pod: pod["metadata"]["annotations"].__setitem__(ANN_GPU_UUID, "{gpu}"),
        ANN_GPU_UUID,
    ),
    "grants itself all threads": (_annotation(ANN_THREAD_PERCENT, "100"), ANN_THREAD_PERCENT),
    "claims to be allocated": (_annotation(ANN_STATE, "allocated"), ANN_STATE),
    "backdates its bind": (_annotation(ANN_BIND_TIME, "2000-01-01T00:00:00Z"), ANN_BIND_TIME),
    "skips the scheduler": (
        lambda pod: pod["spec"].__setitem__("nodeName", "{node}"),
        "spec.nodeName",
    ),
    "picks another scheduler": (
        lambda pod: pod["spec"].__setitem__("schedulerName", "default-scheduler-2"),
        "spec.schedulerName",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_pod_trying_to_get_around_its_share_is_refused_naming_field_and_fix(
    cluster: Any, namespace: str, case: str
) -> None:
    change, field = HOSTILE[case]
    name = f"hostile-{uuid.uuid4().hex[:6]}"
    pod = hostile_pod(cluster, name)
    change(pod)
    text = (
        json.dumps(pod)
        .replace("{gpu}", another_pods_gpu(cluster))
        .replace("{node}", cluster.node_name)
    )
    out = run_kubectl(cluster, "create", "-n", namespace, "-f", "-", input=text)
    assert out.returncode != 0, f"the API server admitted a pod that {case}"
    message = out.stderr
    assert "denied the request: gpushare:" in message, message
    assert field in message, message
    # Every refusal says what to do instead.
    assert any(w in message for w in ("remove", "give it a prefix", "use ")), message
    gone = run_kubectl(cluster, "get", "pod", name, "-n", namespace, input="")
    assert gone.returncode != 0 and "NotFound" in gone.stderr  # nothing was stored


def test_env_from_with_a_safe_prefix_is_admitted(cluster: Any, namespace: str) -> None:
    pod = hostile_pod(cluster, f"prefixed-{uuid.uuid4().hex[:6]}")
    _env_from("APP_")(pod)
    out = run_kubectl(
        cluster, "create", "-n", namespace, "--dry-run=server", "-f", "-", input=json.dumps(pod)
    )
    assert out.returncode == 0, out.stderr


# ---- GpuShare objects against the real schema ---------------------------------------------

text_values = st.one_of(
    st.sampled_from(
        ["0.25", "25%", "1", "0", "1.5", "12.5%", "0.333", "-1", "", " 0.5", "10Gi", "1e3", "NaN"]
    ),
    st.text(max_size=10),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | text_values,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
valid_specs = st.fixed_dictionaries(
    {"fraction": st.sampled_from(["0.25", "0.5", "25%", "1", "0.05", "10%"])},
    optional={
        "memory": st.sampled_from(["10Gi", "512Mi", "1Gi"]),
        "class": st.sampled_from(["latency", "batch"]),
        "selector": st.fixed_dictionaries(
            {"matchLabels": st.fixed_dictionaries({"app": st.sampled_from(["a", "train-1"])})}
        ),
        "packing": st.fixed_dictionaries(
            {},
            optional={
                "policy": st.sampled_from(["binpack", "spread"]),
                "maxPodsPerGpu": st.integers(1, 48),
            },
        ),
        "profiling": st.fixed_dictionaries({"windowSeconds": st.integers(10, 600)}),
    },
)
junk_specs = st.fixed_dictionaries(
    {},
    optional={
        "fraction": text_values | json_values,
        "memory": text_values | json_values,
        "class": st.sampled_from(["latency", "batch", "urgent", ""]) | json_values,
        "selector": st.fixed_dictionaries(
            {},
            optional={"matchLabels": st.dictionaries(st.text(max_size=5), text_values, max_size=2)},
        )
        | json_values,
        "packing": st.fixed_dictionaries(
            {},
            optional={
                "policy": st.sampled_from(["binpack", "spread", "aggressive", "x"]) | json_values,
                "maxPodsPerGpu": st.integers(-5, 100) | json_values,
            },
        )
        | json_values,
        "profiling": st.fixed_dictionaries(
            {}, optional={"windowSeconds": st.integers(-5, 10_000) | json_values}
        )
        | json_values,
        "unknownField": json_values,
    },
)
# Half well-formed (with one field perhaps replaced by junk), half junk.
specs = st.one_of(
    valid_specs,
    st.tuples(valid_specs, junk_specs).map(lambda pair: {**pair[0], **pair[1]}),
    junk_specs,
)


@pytest.fixture(scope="module")
def crd(cluster: Any) -> None:
    cluster.kubectl("apply", "-f", str(CRD))
    cluster.kubectl("wait", "--for", "condition=established", "crd/gpushares.gpushare.io")


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(spec=specs)
def test_random_gpushare_is_stored_or_refused_with_a_reason_never_a_server_error(
    cluster: Any, namespace: str, crd: None, spec: dict[str, Any]
) -> None:
    name = f"fuzz-{uuid.uuid4().hex[:8]}"
    doc = {
        "apiVersion": "gpushare.io/v1alpha1",
        "kind": "GpuShare",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    STATS["cases"] += 1
    out = run_kubectl(cluster, "create", "-f", "-", "-o", "json", input=json.dumps(doc))
    if "InternalError" in out.stderr or "Internal error" in out.stderr or out.returncode > 1:
        STATS["crashes"] += 1
        pytest.fail(f"server error for {spec}: {out.stderr}")
    exists = run_kubectl(cluster, "get", "gpushare", name, "-n", namespace, input="")
    if out.returncode != 0:
        STATS["refused"] += 1
        assert "is invalid" in out.stderr or "BadRequest" in out.stderr or "error" in out.stderr
        assert "spec" in out.stderr or "unknown field" in out.stderr, out.stderr
        assert exists.returncode != 0, "a refused GpuShare was stored"
        return
    STATS["accepted"] += 1
    assert exists.returncode == 0
    stored = json.loads(out.stdout)["spec"]
    try:
        parse_spec(stored)
    except InvalidInputError:
        STATS["disagreements"] += 1  # the operator reports it on the object; not a crash
    run_kubectl(cluster, "delete", "gpushare", name, "-n", namespace, "--wait=false", input="")


def test_fuzz_statistics_are_recorded(cluster: Any) -> None:
    """Publishes the GpuShare fuzzing figures for bench/faults/summary.py."""
    path = Path(cluster.state_dir) / "reliability" / "gpushare-fuzz.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(STATS, indent=2))
    assert STATS["crashes"] == 0
