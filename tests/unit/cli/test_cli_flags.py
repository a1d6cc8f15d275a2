"""`kubectl gpushare` flags and formats, run through the real entry point (``main``).

The cluster is read by ``main``'s ``read`` argument: here a snapshot of nodes and pods as the
API server would list them (the same dicts ``read_cluster`` returns); tests/cluster reads a
real API server. Each test checks what a user sees: rows, documents, exit status, the error.
"""

import io
import json
import re
from typing import Any

import pytest
import yaml

from gpushare.api.names import ANN_PAUSE, ANN_PAUSED, ANN_TIER, TIER_OPPORTUNISTIC
from gpushare.api.pause import PauseRequest
from gpushare.cli.main import complete_main, main
from gpushare.cli.watch import watch
from gpushare.kube.cli import ALL_NAMESPACES, Query, Snapshot
from tests.fixtures.builders import GPU_A, GPU_B, NODES
from tests.fixtures.builders import cli_gpu as gpu
from tests.fixtures.builders import cli_node as node
from tests.fixtures.builders import placed_pod as pod


def labelled(p: dict[str, Any], **labels: str) -> dict[str, Any]:
    p["metadata"]["labels"] = labels
    return p


class Cluster:
    """Answers reads like the API server: pods of the namespace asked for (all for "*")."""

    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.nodes, self.pods = nodes, pods
        self.queries: list[Query] = []
        self.context_namespace = "ml"

    def __call__(self, query: Query) -> Snapshot:
        self.queries.append(query)
        namespace = query.namespace or self.context_namespace
        pods = [
            p
            for p in self.pods
            if namespace == ALL_NAMESPACES or p["metadata"]["namespace"] == namespace
        ]
        return Snapshot(nodes=self.nodes, pods=pods, namespace=namespace)


@pytest.fixture
def cluster() -> Cluster:
    pods = [
        labelled(pod("ml", "small", GPU_A, "0.25", 25), app="train", team="a"),
        labelled(pod("web", "infer", GPU_A, "50%", 70), app="infer", team="b"),
        labelled(pod("ml", "big", f"{GPU_A},{GPU_B}", "2", 100), app="train", team="b"),
    ]
    nodes = [*NODES]
    nodes[0] = {**nodes[0], "metadata": {**nodes[0]["metadata"], "labels": {"pool": "h100"}}}
    nodes.append(node("node-b", [gpu("GPU-cccccccc-0000-0000-0000-000000000000", 0)]))
    return Cluster(nodes, pods)


def run(cluster: Cluster, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv), read=cluster)
    out, err = capsys.readouterr()
    return code, out, err


def column(out: str, name: str) -> list[str]:
    header, *rows = out.splitlines()
    start = re.search(rf"(?<!\S){name}(?!\S)", header).start()  # type: ignore[union-attr]
    return [r[start:].split()[0] for r in rows]


def test_get_pods_lists_the_context_namespace_like_kubectl(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(cluster, capsys, "get", "pods")
    assert code == 0
    assert out.splitlines()[0].split() == [
        "NAME", "NODE", "GPU", "REQUEST", "LIMIT", "MEM-LIMIT", "STATE", "PAUSED",
    ]  # fmt: skip
    assert column(out, "NAME") == ["big", "small"]
    assert column(out, "GPU") == ["0,1", "0"]
    assert cluster.queries[-1].namespace is None  # the context's namespace


def test_get_pods_shows_paused_pods_and_why(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """PAUSED: yes once the node agent froze the pod (gpushare.io/paused), asked while only the
    controller's request is there; -o wide names the reason, -o json the message too."""
    request = PauseRequest(
        reason="guaranteed-needs-room", message="web/infer needs GPU 0", since="t1"
    ).dump()
    small, big = cluster.pods[0], cluster.pods[2]
    small["metadata"]["annotations"][ANN_PAUSE] = request
    small["metadata"]["annotations"][ANN_PAUSED] = '{"requestSince":"t1","since":"t2"}'
    big["metadata"]["annotations"][ANN_PAUSE] = request
    code, out, _ = run(cluster, capsys, "get", "pods")
    assert code == 0
    assert column(out, "PAUSED") == ["asked", "yes"]  # big, small
    _, wide, _ = run(cluster, capsys, "get", "pods", "-o", "wide")
    assert column(wide, "PAUSE-REASON") == ["guaranteed-needs-room"] * 2
    _, doc, _ = run(cluster, capsys, "get", "pods", "-o", "json")
    items = {i["name"]: i for i in json.loads(doc)["items"]}
    assert items["small"]["paused"] == "yes"
    assert items["small"]["pause_message"] == "web/infer needs GPU 0"
    _, web, _ = run(cluster, capsys, "get", "pods", "-n", "web", "-o", "wide")
    assert (column(web, "PAUSED"), column(web, "PAUSE-REASON")) == (["-"], ["-"])


def test_all_namespaces_adds_the_namespace_column(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    for flag in ("-A", "--all-namespaces"):
        code, out, _ = run(cluster, capsys, "get", "pods", flag, "-n", "web")
        assert code == 0
        assert column(out, "NAMESPACE") == ["ml", "ml", "web"]
        assert cluster.queries[-1].namespace == ALL_NAMESPACES


def test_namespace_flag_reads_only_that_namespace(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(cluster, capsys, "get", "pods", "-n", "web")
    assert (code, column(out, "NAME")) == (0, ["infer"])
    code, out, _ = run(cluster, capsys, "get", "pods", "-n", "empty")
    assert (code, out) == (0, "No gpushare pods found in empty namespace.\n")


def test_top_shows_every_namespace_unless_told(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    _, everything, _ = run(cluster, capsys, "top")
    assert "infer" in everything and "small" in everything
    _, only_web, _ = run(cluster, capsys, "top", "-n", "web")
    assert "infer" in only_web and "small" not in only_web
    # No command is top.
    code, default, _ = run(cluster, capsys)
    assert (code, default) == (0, everything)


def test_selector_keeps_matching_pods_and_is_sent_to_the_server(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(cluster, capsys, "get", "pods", "-A", "-l", "app=train,team!=a")
    assert (code, column(out, "NAME")) == (0, ["big"])
    sent = cluster.queries[-1].pod_selector
    assert [r.encode() for r in sent] == ["app=train", "team!=a"]
    _, out, _ = run(cluster, capsys, "get", "pods", "-A", "--selector", "team in (b), !missing")
    assert column(out, "NAME") == ["big", "infer"]
    _, out, _ = run(cluster, capsys, "top", "-l", "app=infer")
    assert "infer" in out and "small" not in out and "big" not in out


def test_selector_on_gpus_selects_nodes(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(cluster, capsys, "get", "gpus")
    assert (code, column(out, "NODE")) == (0, ["node-a", "node-a", "node-b"])
    assert column(out, "ALLOCATED") == ["175%", "100%", "0%"]
    _, out, _ = run(cluster, capsys, "get", "gpus", "-l", "pool=h100")
    assert column(out, "NODE") == ["node-a", "node-a"]
    assert [r.encode() for r in cluster.queries[-1].node_selector] == ["pool=h100"]


@pytest.mark.parametrize("bad", ["app=", "a in (b", "in (x)", "app=x y", "a notin ()"])
def test_a_malformed_selector_names_the_flag(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    code, out, err = run(cluster, capsys, "get", "pods", "-l", bad)
    if bad == "app=":  # an empty value is valid, as in kubectl: the label is set to ""
        assert code == 0
        return
    assert code == 1 and out == ""
    assert err.startswith("error: -l/--selector:") and "kubectl" in err
    assert cluster.queries == []  # refused before asking the cluster


def test_wide_adds_columns(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    _, narrow, _ = run(cluster, capsys, "get", "pods", "-A")
    code, wide, _ = run(cluster, capsys, "get", "pods", "-A", "-o", "wide")
    assert code == 0
    assert "GPU-UUID" not in narrow
    assert column(wide, "GPU-UUID")[0] == f"{GPU_A},{GPU_B}"
    assert column(wide, "PHASE") == ["Running"] * 3
    _, gpus, _ = run(cluster, capsys, "get", "gpus", "-o", "wide")
    assert column(gpus, "UUID")[:2] == [GPU_A, GPU_B]
    assert column(gpus, "SIMULATED") == ["no"] * 3
    _, top, _ = run(cluster, capsys, "top", "-o", "wide")
    assert "STATE" in top and "allocated" in top


def test_wide_shows_which_pods_run_opportunistically(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.pods[0]["metadata"]["annotations"][ANN_TIER] = TIER_OPPORTUNISTIC
    _, wide, _ = run(cluster, capsys, "get", "pods", "-A", "-o", "wide")
    assert sorted(column(wide, "TIER")) == ["guaranteed", "guaranteed", "opportunistic"]
    _, top, _ = run(cluster, capsys, "top", "-o", "wide")
    assert "TIER" in top and "opportunistic" in top


@pytest.mark.parametrize("command", [["top"], ["get", "pods", "-A"], ["get", "gpus"]])
def test_json_and_yaml_carry_the_same_document(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    code, as_json, _ = run(cluster, capsys, *command, "-o", "json")
    assert code == 0
    code, as_yaml, _ = run(cluster, capsys, *command, "-o", "yaml")
    assert code == 0
    assert json.loads(as_json) == yaml.safe_load(as_yaml)
    assert json.loads(as_json)


def test_pods_document_names_each_gpu_once_per_pod(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = run(cluster, capsys, "get", "pods", "-A", "-o", "yaml")
    items = {i["name"]: i for i in yaml.safe_load(out)["items"]}
    assert [g["uuid"] for g in items["big"]["gpus"]] == [GPU_A, GPU_B]
    assert (items["infer"]["request_percent"], items["infer"]["limit_percent"]) == (50, 70)


def test_unknown_output_is_a_usage_error_naming_the_flag(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["get", "pods", "-o", "table"], read=cluster)
    assert done.value.code == 2
    assert "-o/--output: invalid choice: 'table'" in capsys.readouterr().err


def test_unknown_node_names_the_flag(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(cluster, capsys, "get", "gpus", "--node", "nope")
    assert code == 1
    assert err.startswith("error: --node: no node named 'nope'")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == "gpushare 0.1.0"


def test_watch_prints_each_change_and_stops_at_its_timeout(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """-w: the first view, then a new one only when the cluster changed; --watch-timeout ends
    it with status 0. Time is the test's, so it runs at once."""
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if now[0] == 4.0:  # a pod arrives between the second and third read
            cluster.pods.append(pod("ml", "late", GPU_B, "0.1", 10))

    monkeypatch.setattr("gpushare.cli.watch.time.sleep", sleep)
    monkeypatch.setattr("gpushare.cli.watch.time.monotonic", lambda: now[0])
    code, out, _ = run(
        cluster, capsys, "get", "pods", "-w", "--interval", "2", "--watch-timeout", "9"
    )
    assert code == 0
    frames = out.split("\n\n")
    assert len(frames) == 2  # unchanged reads print nothing
    assert "late" not in frames[0] and "late" in frames[1]
    assert len(cluster.queries) == 5  # reads at 0, 2, 4, 6, 8 s


def test_watch_yaml_is_a_stream_of_documents(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        cluster.pods.append(pod("ml", f"p{int(now[0])}", GPU_B, "0.1", 10))

    monkeypatch.setattr("gpushare.cli.watch.time.sleep", sleep)
    monkeypatch.setattr("gpushare.cli.watch.time.monotonic", lambda: now[0])
    code, out, _ = run(
        cluster, capsys, "get", "pods", "-o", "yaml", "-w", "--interval", "1",
        "--watch-timeout", "2",
    )  # fmt: skip
    assert code == 0
    documents = list(yaml.safe_load_all(out))
    assert [len(d["items"]) for d in documents] == [2, 3, 4]


def test_ctrl_c_ends_a_watch_cleanly() -> None:
    out = io.StringIO()

    def interrupted(_: float) -> None:
        raise KeyboardInterrupt

    assert watch(lambda: "view\n", interval_s=1, timeout_s=0, out=out, sleep=interrupted) == 0
    assert out.getvalue() == "view\n\n"


def test_a_failed_read_during_a_watch_is_reported_and_retried(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpushare.api.errors import InvalidInputError  # noqa: PLC0415

    reads = [0]

    def flaky(query: Query) -> Snapshot:
        reads[0] += 1
        if reads[0] == 2:
            raise InvalidInputError("cluster", "cannot reach the API server", "check it")
        return cluster(query)

    now = [0.0]
    monkeypatch.setattr("gpushare.cli.watch.time.sleep", lambda s: now.__setitem__(0, now[0] + s))
    monkeypatch.setattr("gpushare.cli.watch.time.monotonic", lambda: now[0])
    code = main(["get", "gpus", "-w", "--interval", "1", "--watch-timeout", "3"], read=flaky)
    out, err = capsys.readouterr()
    assert code == 0 and reads[0] == 4
    assert "error: cluster: cannot reach the API server; check it (retrying in 1s)" in err
    assert out.count("NODE") == 1


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["top", "--interval", "0.1", "-w"], "--interval"),
        (["top", "--watch-timeout", "5"], "--watch-timeout"),
        (["top", "--watch-timeout", "-1", "-w"], "--watch-timeout"),
        (["top", "--timeout", "0"], "--timeout"),
        (["top", "--interval", "2"], "--interval"),
    ],
)
def test_watch_flags_are_checked(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], argv: list[str], flag: str
) -> None:
    code, _, err = run(cluster, capsys, *argv)
    assert code == 1
    assert err.startswith(f"error: {flag}:")
    assert cluster.queries == []


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_scripts_ask_the_program_itself(
    capsys: pytest.CaptureFixture[str], shell: str
) -> None:
    assert main(["completion", shell]) == 0
    text = capsys.readouterr().out
    assert "__complete" in text
    assert "gpushare kubectl-gpushare" in text


def test_completion_unknown_shell_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["completion", "fish"])
    assert done.value.code == 2
    assert "invalid choice: 'fish'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("words", "expected", "directive"),
    [
        ([""], ["completion", "get", "top"], ":4"),
        (["get", ""], ["gpu", "gpus", "po", "pod", "pods"], ":4"),
        (
            ["get", "pods", "-o", ""],
            [
                "custom-columns-file=",
                "custom-columns=",
                "json",
                "jsonpath-file=",
                "jsonpath=",
                "name",
                "wide",
                "yaml",
            ],
            ":4",
        ),
        (["top", "--all"], ["--all-namespaces"], ":4"),
        (["completion", "z"], ["zsh"], ":4"),
        (["top", "--kubeconfig", ""], [], ":0"),
    ],
)
def test_kubectl_plugin_completion_protocol(
    capsys: pytest.CaptureFixture[str], words: list[str], expected: list[str], directive: str
) -> None:
    """kubectl runs kubectl_complete-gpushare WORDS and reads candidates, then :directive."""
    assert complete_main(words) == 0
    assert capsys.readouterr().out.splitlines() == [*expected, directive]
    assert main(["__complete", *words]) == 0
    assert capsys.readouterr().out.splitlines() == [*expected, directive]


def test_get_gpus_has_no_namespace_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["get", "gpus", "-A"])
    assert done.value.code == 2
    assert "unrecognized arguments: -A" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("selector", "labels", "selected"),
    [
        ("app=web", {"app": "web"}, True),
        ("app==web", {"app": "db"}, False),
        ("app!=web", {}, True),  # as the API server: a missing label is "not web"
        ("env notin (a,b)", {}, True),
        ("env in (a, b)", {"env": "b"}, True),
        ("env in (a,b)", {}, False),
        ("tier", {"tier": ""}, True),
        ("!tier", {"tier": "x"}, False),
        ("example.com/team=a,app", {"example.com/team": "a"}, False),
    ],
)
def test_selector_semantics_follow_kubernetes(
    selector: str, labels: dict[str, str], selected: bool
) -> None:
    from gpushare.api.selector import matches, parse_selector  # noqa: PLC0415

    assert matches(parse_selector(selector), labels) is selected
