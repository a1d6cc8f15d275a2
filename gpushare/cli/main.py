"""``kubectl gpushare`` (a kubectl plugin) and ``gpushare``: what runs on each shared GPU.

``top`` lists, per node and GPU, the pods placed there with their compute fractions, MPS thread
percentages and memory, and, given an exporter or Prometheus URL, the live per-pipe
utilization; ``get pods`` / ``get gpus`` list them one row each. The cluster is read with the
caller's kubeconfig (KUBECONFIG). Exit status: 0 done, 1 a refused value or an unreachable
cluster (the message names the flag and the fix), 2 a command line that does not parse,
130 interrupted (Ctrl-C ends ``--watch`` with 0). See docs/cli.md.
"""

import argparse
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from gpushare.api.errors import InvalidInputError
from gpushare.api.selector import parse_selector
from gpushare.cli.args import (
    DEFAULT_INTERVAL_S,
    MIN_INTERVAL_S,
    build_parser,
    with_default_command,
)
from gpushare.cli.completion import candidates, script
from gpushare.cli.live import TOKEN_FLAG, from_exporters, from_prometheus, read_token
from gpushare.cli.outputs import (
    Output,
    custom_columns,
    jsonpath,
    names,
    parse_output,
    reorder_table,
    sort_order,
)
from gpushare.cli.render import dump, printable, render_json, render_text
from gpushare.cli.tables import gpus_document, pods_document, render_gpus, render_pods
from gpushare.cli.view import Live, NodeRow, build_view
from gpushare.cli.watch import follow, watch
from gpushare.kube.cli import ALL_NAMESPACES, Query, Snapshot, follow_cluster, read_cluster

EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130

Reader = Callable[[Query], Snapshot]
Follower = Callable[[Query], Iterator[Snapshot | InvalidInputError]]


def _prog() -> str:
    """How the user called us: kubectl runs kubectl-gpushare; krew's launcher says so in
    GPUSHARE_PROG (deploy/krew)."""
    if os.environ.get("GPUSHARE_PROG") == "kubectl gpushare":
        return "kubectl gpushare"
    name = Path(sys.argv[0]).name
    return "kubectl gpushare" if name.startswith("kubectl") else "gpushare"


def _check_live(args: argparse.Namespace) -> None:
    """One live source at most, and a token file only with one (read once now, so a bad one
    is refused before the cluster is read)."""
    if args.prometheus and args.metrics_url:
        raise InvalidInputError(
            "--prometheus", "is given together with --metrics-url", "use one of the two"
        )
    if args.bearer_token_file is not None:
        if not (args.prometheus or args.metrics_url):
            raise InvalidInputError(
                TOKEN_FLAG, "is given without a live source", "add --metrics-url or --prometheus"
            )
        read_token(args.bearer_token_file)


def _live(args: argparse.Namespace) -> Live | None:
    if not (args.prometheus or args.metrics_url):
        return None
    token = read_token(args.bearer_token_file)  # again at each read: tokens are rotated
    if args.prometheus:
        return from_prometheus(args.prometheus, timeout_s=args.timeout, token=token)
    return from_exporters(args.metrics_url, timeout_s=args.timeout, token=token)


def _query(args: argparse.Namespace) -> Query:
    namespaced = hasattr(args, "namespace")
    if not namespaced or args.all_namespaces:
        namespace: str | None = ALL_NAMESPACES
    elif args.namespace:
        namespace = args.namespace
    else:
        namespace = ALL_NAMESPACES if args.command == "top" else None
    selector = parse_selector(args.selector)
    on_nodes = not namespaced
    return Query(
        kubeconfig=args.kubeconfig,
        context=args.context,
        namespace=namespace,
        pod_selector=() if on_nodes else selector,
        node_selector=selector if on_nodes else (),
        node=args.node,
        timeout_s=args.timeout,
    )


def _check(args: argparse.Namespace) -> None:
    if args.timeout <= 0:
        raise InvalidInputError("--timeout", "must be positive", "give seconds, e.g. 10")
    if not args.watch and (args.watch_timeout or args.interval is not None):
        flag = "--watch-timeout" if args.watch_timeout else "--interval"
        raise InvalidInputError(flag, "only applies with -w/--watch", "add -w or drop it")
    if args.interval is None:
        args.interval = DEFAULT_INTERVAL_S
    if args.interval < MIN_INTERVAL_S:
        raise InvalidInputError(
            "--interval", f"{args.interval:g} is below {MIN_INTERVAL_S:g}", "give seconds, e.g. 2"
        )
    if args.watch_timeout < 0:
        raise InvalidInputError("--watch-timeout", "must not be negative", "give 0 or seconds")
    _check_live(args)
    args.output = parse_output(args.output)
    if args.command == "top" and (args.output.format in ("name", "custom-columns") or args.sort_by):
        raise InvalidInputError(
            "--sort-by" if args.sort_by else "-o/--output",
            "applies to get pods and get gpus (one row each), not to top",
            "use kubectl gpushare get pods|gpus, or -o json|yaml|jsonpath= with top",
        )


def _render(args: argparse.Namespace, query: Query, read: Reader) -> str:
    """One read of the cluster (and live source), rendered as asked."""
    return _render_snapshot(args, query, read(query))


def _render_snapshot(args: argparse.Namespace, query: Query, snapshot: Snapshot) -> str:
    live = _live(args)
    namespace = None if snapshot.namespace == ALL_NAMESPACES else snapshot.namespace
    view = build_view(
        snapshot.nodes,
        snapshot.pods,
        slices=snapshot.slices,
        claims=snapshot.claims,
        live=live,
        node_filter=args.node,
        namespace=namespace,
        pod_selector=query.pod_selector,
        node_selector=query.node_selector,
    )
    if args.node and not view:
        raise InvalidInputError(
            "--node", f"no node named {args.node!r}", "list nodes with kubectl get nodes"
        )
    source = live.source if live is not None else None
    return _format(args, view, source=source, namespace=snapshot.namespace)


def _format(
    args: argparse.Namespace, view: list[NodeRow], *, source: str | None, namespace: str
) -> str:
    output: Output = args.output
    wide, live = output.format == "wide", source is not None
    if args.command == "top":
        document = render_json(view, live_source=source)
        if output.document:
            return dump(document, output=output.format)
        if output.format == "jsonpath":
            return jsonpath(document, output.template)
        return render_text(view, live_source=source, wide=wide, no_headers=args.no_headers)
    gpus = args.kind in ("gpus", "gpu")
    document = gpus_document(view) if gpus else pods_document(view)
    order = sort_order(document["items"], args.sort_by) if args.sort_by else None
    if order is not None:
        document = {**document, "items": [document["items"][i] for i in order]}
    if output.document:
        return dump(document, output=output.format)
    if output.format == "jsonpath":
        return jsonpath(document, output.template)
    if output.format == "name":
        return names(document["items"], "gpu" if gpus else "pod")
    if output.format == "custom-columns":
        return custom_columns(document["items"], output.template, no_headers=args.no_headers)
    if gpus:
        text = render_gpus(view, wide=wide, live=live)
    else:
        text = render_pods(
            view,
            all_namespaces=namespace == ALL_NAMESPACES,
            wide=wide,
            live=live,
            namespace=namespace,
        )
    if order is None and not args.no_headers:
        return text
    return reorder_table(text, order or range(len(document["items"])), no_headers=args.no_headers)


def complete_main(argv: Sequence[str] | None = None) -> int:
    """``kubectl_complete-gpushare WORDS...``: kubectl's plugin completion
    (gpushare.cli.completion)."""
    words = list(sys.argv[1:] if argv is None else argv)
    found, directive = candidates(build_parser("gpushare"), words)
    print("\n".join([*found, directive]))
    return 0


def main(
    argv: Sequence[str] | None = None,
    *,
    read: Reader = read_cluster,
    follow_with: Follower | None = None,
) -> int:
    """The CLI. ``read`` is how the cluster is read (the API server, through the kubeconfig);
    ``follow_with`` how ``-w`` follows it (the watch API; a reader given without one is read
    again every ``--interval`` instead)."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["__complete"]:
        return complete_main(words[1:])
    prog = _prog()
    args = build_parser(prog).parse_args(with_default_command(words))
    if args.command == "completion":
        sys.stdout.write(script(args.shell, prog=prog))
        return 0
    try:
        _check(args)
        query = _query(args)
        separator = "---\n" if args.output.format == "yaml" else ""
        if follow_with is None and read is read_cluster:
            follow_with = follow_cluster
        if args.watch and follow_with is not None:
            live = bool(args.prometheus or args.metrics_url)
            return follow(
                follow_with(query),
                lambda snapshot: _render_snapshot(args, query, snapshot),
                refresh_s=args.interval if live else None,
                timeout_s=args.watch_timeout,
                separator=separator,
            )
        if args.watch:
            return watch(
                lambda: _render(args, query, read),
                interval_s=args.interval,
                timeout_s=args.watch_timeout,
                separator=separator,
            )
        sys.stdout.write(_render(args, query, read))
    except InvalidInputError as exc:
        print(f"error: {printable(str(exc))}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
