"""The command line of ``kubectl gpushare``: commands and flags, named as kubectl names them.

``top`` (the default command) shows every GPU with the pods sharing it; ``get pods`` and
``get gpus`` list one row per pod or GPU. All three take ``-o wide|json|yaml``, ``-l``,
``--node``, ``-w/--watch`` and a live source (``--prometheus`` or ``--metrics-url``).
Namespaces: ``get pods`` reads the kubeconfig context's namespace unless ``-n`` or ``-A``
(like ``kubectl get pods``); ``top`` shows every namespace unless ``-n`` (like
``kubectl top node``, it is a view of nodes). See docs/cli.md.
"""

import argparse
from importlib import metadata
from pathlib import Path

import gpushare
from gpushare.cli.completion import SCRIPTS

DISTRIBUTION = "kube-gpushare"
COMMANDS = ("top", "get", "completion")
OUTPUTS = ("wide", "json", "yaml", "name", "text")
TEMPLATED_OUTPUTS = ("jsonpath=", "jsonpath-file=", "custom-columns=", "custom-columns-file=")


class OutputChoices(tuple[str, ...]):
    """``-o``'s choices: the plain ones, and kubectl's ``jsonpath=...``-style ones (argparse
    checks membership; completion and help list them)."""

    def __contains__(self, value: object) -> bool:
        text = str(value)
        return text in OUTPUTS or any(
            text.startswith(t) and len(text) > len(t) for t in TEMPLATED_OUTPUTS
        )


MIN_INTERVAL_S = 1.0
DEFAULT_INTERVAL_S = 2.0


def version() -> str:
    """The installed distribution's version (the package's own when run from a checkout)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return gpushare.__version__


def _common(p: argparse.ArgumentParser, *, namespaced: bool, selects: str) -> None:
    """The flags every view command takes: where the cluster is, what to show and how, and
    (:func:`_live_and_watch`) live readings and ``-w``."""
    p.add_argument("--kubeconfig", type=Path, help="kubeconfig file (default: $KUBECONFIG)")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")
    if namespaced:
        p.add_argument("-n", "--namespace", help="only pods of this namespace")
        p.add_argument(
            "-A",
            "--all-namespaces",
            action="store_true",
            help="pods of every namespace (wins over -n, as in kubectl)",
        )
    p.add_argument(
        "-l",
        "--selector",
        metavar="SELECTOR",
        help=f"label selector on {selects}, e.g. -l app=web,tier!=db or -l 'env in (a,b)'",
    )
    p.add_argument("--node", help="only this node")
    p.add_argument(
        "-o",
        "--output",
        choices=OutputChoices((*OUTPUTS[:-1], *TEMPLATED_OUTPUTS)),
        default="text",
        help="wide (more columns), json, yaml, name, jsonpath=TEMPLATE, jsonpath-file=FILE, "
        "custom-columns=SPEC, custom-columns-file=FILE (as kubectl); default: a table",
    )
    p.add_argument("--no-headers", action="store_true", help="no header row in tables (as kubectl)")
    p.add_argument(
        "--sort-by",
        metavar="JSONPATH",
        help="sort rows by this field of their -o json object, e.g. --sort-by=.request_percent",
    )
    _live_and_watch(p)
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default 10)")


def _live_and_watch(p: argparse.ArgumentParser) -> None:
    """Live readings (Prometheus or node agents' /metrics) and ``-w`` with its timings."""
    p.add_argument("--prometheus", metavar="URL", help="Prometheus base URL for live readings")
    p.add_argument(
        "--metrics-url",
        metavar="URL",
        action="append",
        default=[],
        help="a node agent's /metrics URL for live readings (repeatable)",
    )
    p.add_argument(
        "--bearer-token-file",
        metavar="FILE",
        help="a file holding the bearer token sent with live reads: a node agent's /metrics "
        "answers only tokens allowed to get /metrics (the chart's monitoring.metricsReaders); "
        "in a pod, its service account's /var/run/secrets/kubernetes.io/serviceaccount/token",
    )
    p.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help="list once, then follow the API server's watch and print the view on each change",
    )
    p.add_argument(
        "--interval",
        type=float,
        metavar="SECONDS",
        help="with --watch and a live source, seconds between live readings (default "
        f"{DEFAULT_INTERVAL_S:g}, at least {MIN_INTERVAL_S:g})",
    )
    p.add_argument(
        "--watch-timeout",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="stop watching after this long (default 0: until Ctrl-C)",
    )


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Show how gpushare shares each GPU: pods, fractions, thread %, memory and "
        "live per-pipe utilization. Without a command: top.",
    )
    parser.add_argument("--version", action="version", version=f"{prog} {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    top = sub.add_parser(
        "top",
        help="per node and GPU: pods, fractions, thread %%, memory, live pipes (default)",
        description="Per node and GPU: the pods placed there, their fractions, MPS thread "
        "percentages and memory, and live per-pipe utilization when a source is given. "
        "Every namespace unless -n.",
    )
    _common(top, namespaced=True, selects="pods")
    get = sub.add_parser(
        "get",
        help="one row per gpushare pod or GPU",
        description="List gpushare pods (the context's namespace unless -n or -A) or GPUs.",
    )
    kinds = get.add_subparsers(dest="kind", metavar="KIND", required=True)
    pods = kinds.add_parser(
        "pods",
        aliases=["pod", "po"],
        help="pods placed on shared GPUs",
        description="Pods placed on shared GPUs: GPU, request, limit, memory limit, state. "
        "The kubeconfig context's namespace unless -n or -A.",
    )
    _common(pods, namespaced=True, selects="pods")
    gpus = kinds.add_parser(
        "gpus",
        aliases=["gpu"],
        help="GPUs gpushare manages",
        description="GPUs gpushare manages: model, allocated share, limits, pods, memory. "
        "Allocations count the pods of every namespace.",
    )
    _common(gpus, namespaced=False, selects="nodes")
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description="Print a completion script for bash or zsh. Load it with "
        f"'source <({prog} completion bash)' (add it to ~/.bashrc or ~/.zshrc to keep it).",
    )
    completion.add_argument("shell", choices=sorted(SCRIPTS))
    return parser


def with_default_command(argv: list[str]) -> list[str]:
    """``top`` when no command is named (``kubectl gpushare -n ml`` is ``top -n ml``)."""
    if argv and (argv[0] in COMMANDS or argv[0] in ("-h", "--help", "--version")):
        return argv
    return ["top", *argv]
