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
from collections.abc import Callable, Sequence
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
from gpushare.cli.live import from_exporters, from_prometheus
from gpushare.cli.render import dump, printable, render_json, render_text
from gpushare.cli.tables import gpus_document, pods_document, render_gpus, render_pods
from gpushare.cli.view import Live, NodeRow, build_view
from gpushare.cli.watch import watch
from gpushare.kube.cli import ALL_NAMESPACES, Query, Snapshot, read_cluster

EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130

Reader = Callable[[Query], Snapshot]


def _prog() -> str:
    """How the user called us: kubectl runs kubectl-gpushare; krew's launcher says so in
    GPUSHARE_PROG (deploy/krew)."""
    if os.environ.get("GPUSHARE_PROG") == "kubectl gpushare":
        return "kubectl gpushare"
    name = Path(sys.argv[0]).name
    return "kubectl gpushare" if name.startswith("kubectl") else "gpushare"


def _live(args: argparse.Namespace) -> Live | None:
    if args.prometheus and args.metrics_url:
        raise InvalidInputError(
            "--prometheus", "is given together with --metrics-url", "use one of the two"
        )
    if args.prometheus:
        return from_prometheus(args.prometheus, timeout_s=args.timeout)
    if args.metrics_url:
        return from_exporters(args.metrics_url, timeout_s=args.timeout)
    return None


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


def _render(args: argparse.Namespace, query: Query, read: Reader) -> str:
    """One read of the cluster (and live source), rendered as asked."""
    snapshot = read(query)
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
    wide, live = args.output == "wide", source is not None
    if args.command == "top":
        if args.output in ("json", "yaml"):
            return dump(render_json(view, live_source=source), output=args.output)
        return render_text(view, live_source=source, wide=wide)
    if args.kind in ("gpus", "gpu"):
        if args.output in ("json", "yaml"):
            return dump(gpus_document(view), output=args.output)
        return render_gpus(view, wide=wide, live=live)
    if args.output in ("json", "yaml"):
        return dump(pods_document(view), output=args.output)
    return render_pods(
        view,
        all_namespaces=namespace == ALL_NAMESPACES,
        wide=wide,
        live=live,
        namespace=namespace,
    )


def complete_main(argv: Sequence[str] | None = None) -> int:
    """``kubectl_complete-gpushare WORDS...``: kubectl's plugin completion
    (gpushare.cli.completion)."""
    words = list(sys.argv[1:] if argv is None else argv)
    found, directive = candidates(build_parser("gpushare"), words)
    print("\n".join([*found, directive]))
    return 0


def main(argv: Sequence[str] | None = None, *, read: Reader = read_cluster) -> int:
    """The CLI. ``read`` is how the cluster is read (the API server, through the kubeconfig)."""
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
        if args.watch:
            return watch(
                lambda: _render(args, query, read),
                interval_s=args.interval,
                timeout_s=args.watch_timeout,
                separator="---\n" if args.output == "yaml" else "",
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
