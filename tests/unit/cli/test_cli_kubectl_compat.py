"""kubectl's ways, as `kubectl gpushare` users expect them (#46): ``-o name|jsonpath|
custom-columns``, ``--no-headers``, ``--sort-by``; a multi-file ``KUBECONFIG`` read as kubectl
reads it; ``-w`` following the API server's watch (one list per kind, then events) instead of
listing everything again. The cluster is an API server stand-in speaking HTTP
(tests/fixtures/fake_apiserver.py); kubectl itself reads the kubeconfig.
"""

import io
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushare.cli.main import main
from gpushare.cli.watch import follow
from gpushare.kube.cli import Query, Snapshot, follow_cluster, read_cluster
from tests.fixtures.builders import GPU_A, GPU_B, NODES
from tests.fixtures.builders import placed_pod as pod
from tests.fixtures.fake_apiserver import TOKEN, FakeApiServer, kubectl_binary, split_kubeconfig

PODS_ML = "/api/v1/namespaces/ml/pods"


@pytest.fixture
def apiserver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApiServer]:
    kubectl = kubectl_binary()
    if kubectl is None:
        pytest.skip("kubectl not found: hack/build-tools.sh kube builds it")
    pods = [
        pod("ml", "small", GPU_A, "0.25", 25),
        pod("ml", "big", f"{GPU_A},{GPU_B}", "2", 100),
        pod("ml", "half", GPU_B, "0.5", 50),
    ]
    server = FakeApiServer(
        {"/api/v1/nodes": [dict(n) for n in NODES], PODS_ML: pods, "/api/v1/pods": list(pods)}
    )
    monkeypatch.setenv("KUBECTL", kubectl)
    monkeypatch.setenv("KUBECONFIG", split_kubeconfig(tmp_path, server.url))
    yield server
    server.close()


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_multi_file_kubeconfig_is_read_as_kubectl_reads_it(
    apiserver: FakeApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Cluster and user in one file, the context (and its namespace) in another."""
    code, out, err = cli(capsys, "get", "pods", "-o", "name")
    assert (code, err) == (0, "")
    assert out.splitlines() == ["pod/big", "pod/half", "pod/small"]
    assert (PODS_ML, {}) in [(p, {k: v for k, v in q.items() if v}) for p, q in apiserver.requests]


def test_jsonpath_custom_columns_no_headers_and_sort_by(
    apiserver: FakeApiServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, out, _ = cli(capsys, "get", "pods", "-o", "jsonpath={.items[*].name}")
    assert out == "big half small"
    template = '{range .items[*]}{.name}{"\\t"}{.gpus[*].index}{"\\n"}{end}'
    _, out, _ = cli(capsys, "get", "pods", "-o", f"jsonpath={template}")
    assert out == "big\t0 1\nhalf\t1\nsmall\t0\n"
    spec = "custom-columns=POD:.name,GPUS:.gpus[*].index,REQ:.request_percent"
    _, out, _ = cli(capsys, "get", "pods", "-o", spec, "--sort-by", ".request_percent")
    assert [line.split() for line in out.splitlines()] == [
        ["POD", "GPUS", "REQ"],
        ["small", "0", "25"],
        ["half", "1", "50"],
        ["big", "0,1", "100"],
    ]
    columns = tmp_path / "columns.txt"
    columns.write_text("POD NODE\n.name .node\n")
    _, out, _ = cli(
        capsys, "get", "pods", "-o", f"custom-columns-file={columns}", "--no-headers",
        "--sort-by", "{.name}",
    )  # fmt: skip
    assert [line.split() for line in out.splitlines()] == [
        ["big", "node-a"],
        ["half", "node-a"],
        ["small", "node-a"],
    ]
    # The default table, sorted and headless, as kubectl get does it.
    _, out, _ = cli(capsys, "get", "pods", "--no-headers", "--sort-by", ".request_percent")
    assert [line.split()[0] for line in out.splitlines()] == ["small", "half", "big"]
    code, out, err = cli(capsys, "get", "gpus", "-o", "name")
    assert (code, err) == (0, "")
    assert out.splitlines() == [f"gpu/{GPU_A}", f"gpu/{GPU_B}"]
    _, out, _ = cli(capsys, "top", "-o", "jsonpath={.nodes[*].gpus[*].uuid}")
    assert out == f"{GPU_A} {GPU_B}"


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["get", "pods", "-o", "jsonpath={.items[0"], "-o/--output"),
        (["get", "pods", "-o", "custom-columns=NAME"], "-o/--output"),
        (["top", "--sort-by", ".name"], "--sort-by"),
        (["top", "-o", "name"], "-o/--output"),
        (["get", "pods", "-o", "jsonpath-file=/nonexistent"], "-o/--output"),
    ],
)
def test_bad_outputs_name_the_flag(
    apiserver: FakeApiServer, capsys: pytest.CaptureFixture[str], argv: list[str], flag: str
) -> None:
    code, _, err = cli(capsys, *argv)
    assert code == 1
    assert err.startswith(f"error: {flag}:"), err


def test_a_context_that_does_not_exist_names_the_flag(
    apiserver: FakeApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, "get", "pods", "--context", "nope")
    assert code == 1 and err.startswith("error: --context:"), err


def test_watch_lists_once_then_follows_the_watch_api(apiserver: FakeApiServer) -> None:
    """-w: after one list per kind only watch requests; an event is a new snapshot."""
    stop = threading.Event()
    query = Query(kubeconfig=None, context=None, namespace=None, timeout_s=5)
    updates = follow_cluster(query, stop=stop)
    first = next(updates)
    assert isinstance(first, Snapshot)
    assert sorted(p["metadata"]["name"] for p in first.pods) == ["big", "half", "small"]
    deadline = time.monotonic() + 10
    while not (apiserver.watching(PODS_ML) and apiserver.watching("/api/v1/nodes")):
        assert time.monotonic() < deadline, apiserver.requests
        time.sleep(0.05)
    apiserver.emit(PODS_ML, "ADDED", pod("ml", "late", GPU_B, "0.1", 10))
    second = next(updates)
    assert isinstance(second, Snapshot)
    assert "late" in {p["metadata"]["name"] for p in second.pods}
    apiserver.emit(PODS_ML, "DELETED", pod("ml", "small", GPU_A, "0.25", 25))
    third = next(updates)
    assert isinstance(third, Snapshot)
    assert "small" not in {p["metadata"]["name"] for p in third.pods}
    stop.set()
    assert apiserver.lists(PODS_ML) == 1 and apiserver.lists("/api/v1/nodes") == 1
    watches = [q for p, q in apiserver.requests if p == PODS_ML and q.get("watch") == "true"]
    assert watches[0]["resourceVersion"] == "100"
    assert watches[0]["allowWatchBookmarks"] == "true"


def test_watch_prints_each_change_without_relisting(
    apiserver: FakeApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    def later() -> None:
        deadline = time.monotonic() + 10
        while not apiserver.watching(PODS_ML) and time.monotonic() < deadline:
            time.sleep(0.05)
        apiserver.emit(PODS_ML, "ADDED", pod("ml", "late", GPU_B, "0.1", 10))

    threading.Thread(target=later, daemon=True).start()
    code, out, err = cli(
        capsys, "get", "pods", "-o", "json", "-w", "--watch-timeout", "4"
    )  # fmt: skip
    assert (code, err) == (0, "")
    documents = []
    decoder, text = json.JSONDecoder(), out.lstrip()
    while text:
        doc, end = decoder.raw_decode(text)
        documents.append(doc)
        text = text[end:].lstrip()
    assert [sorted(i["name"] for i in d["items"]) for d in documents] == [
        ["big", "half", "small"],
        ["big", "half", "late", "small"],
    ]
    assert apiserver.lists(PODS_ML) == 1


def test_a_watch_failure_after_the_first_view_is_reported_and_the_watch_goes_on() -> None:
    from gpushare.api.errors import InvalidInputError  # noqa: PLC0415

    def updates() -> Iterator[Any]:
        yield "a"
        yield InvalidInputError("cluster", "cannot reach the API server", "check it")
        yield "b"

    out, err = io.StringIO(), io.StringIO()
    assert follow(updates(), lambda s: f"{s}\n", refresh_s=None, timeout_s=5, out=out, err=err) == 0
    assert out.getvalue() == "a\n\nb\n"
    assert "error: cluster: cannot reach the API server" in err.getvalue()


def test_read_cluster_reads_the_same_through_kubectls_config(apiserver: FakeApiServer) -> None:
    snapshot = read_cluster(Query(kubeconfig=None, context=None, namespace=None))
    assert snapshot.namespace == "ml"
    assert [n["metadata"]["name"] for n in snapshot.nodes] == ["cpu-only", "node-a"]
    assert snapshot.slices == [] and snapshot.claims == []  # no resource.k8s.io here: 404


def test_an_exec_credential_plugin_supplies_the_token(
    apiserver: FakeApiServer, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """As cloud providers' kubeconfigs do (client.authentication.k8s.io/v1)."""
    plugin = tmp_path / "credential.py"
    plugin.write_text(
        "import json, os\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "assert info['kind'] == 'ExecCredential'\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1',"
        " 'kind': 'ExecCredential', 'status': {'token': os.environ['TOKEN_FOR_TEST']}}))\n"
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "cloud",
        "clusters": [{"name": "c", "cluster": {"server": apiserver.url}}],
        "contexts": [
            {"name": "cloud", "context": {"cluster": "c", "user": "u", "namespace": "ml"}}
        ],
        "users": [
            {
                "name": "u",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1",
                        "command": sys.executable,
                        "args": [str(plugin)],
                        "env": [{"name": "TOKEN_FOR_TEST", "value": TOKEN}],
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
    }
    path = tmp_path / "exec.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    code, out, err = cli(capsys, "get", "pods", "-o", "name")
    assert (code, err) == (0, "")
    assert out.splitlines() == ["pod/big", "pod/half", "pod/small"]
