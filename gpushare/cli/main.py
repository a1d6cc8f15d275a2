"""``kubectl gpushare`` (a kubectl plugin) and ``gpushare``: what runs on each shared GPU.

``kubectl gpushare top`` lists, per node and GPU, the pods placed there with their compute
fractions, MPS thread percentages and memory, and, given an exporter or Prometheus URL, the
live per-pipe utilization. It reads the cluster with the caller's kubeconfig (KUBECONFIG).
"""

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.cli.live import from_exporters, from_prometheus
from gpushare.cli.render import render_json, render_text
from gpushare.cli.view import Live, build_view

EXIT_USAGE = 2
EXIT_FAILURE = 1


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Show how gpushare shares each GPU: pods, fractions, thread %, memory and "
        "live per-pipe utilization.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    top = sub.add_parser(
        "top",
        help="per node and GPU: pods, fractions, thread %%, memory, live pipes (default)",
        description="Per node and GPU: the pods placed there, their fractions, MPS thread "
        "percentages and memory, and live per-pipe utilization when a source is given.",
    )
    for p in (parser, top):
        p.add_argument("--kubeconfig", type=Path, help="kubeconfig file (default: $KUBECONFIG)")
        p.add_argument("--context", help="kubeconfig context (default: the current one)")
        p.add_argument("--node", help="only this node")
        p.add_argument("-n", "--namespace", help="only pods of this namespace")
        p.add_argument("--prometheus", metavar="URL", help="Prometheus base URL for live readings")
        p.add_argument(
            "--metrics-url",
            metavar="URL",
            action="append",
            default=[],
            help="a node exporter's /metrics URL for live readings (repeatable)",
        )
        p.add_argument("-o", "--output", choices=("text", "json"), default="text")
        p.add_argument(
            "--timeout", type=float, default=10.0, help="seconds per request (default 10)"
        )
    return parser


def _read_cluster(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Nodes and pods as plain dicts, read with lightkube (sync)."""
    import httpx2 as httpx  # noqa: PLC0415  (lightkube's HTTP client)
    from lightkube import Client, KubeConfig  # noqa: PLC0415  (slow import, only when needed)
    from lightkube.core.exceptions import ApiError, ConfigError  # noqa: PLC0415
    from lightkube.resources.core_v1 import Node, Pod  # noqa: PLC0415

    try:
        if args.kubeconfig is not None:
            if not args.kubeconfig.is_file():
                raise InvalidInputError(
                    "--kubeconfig", f"{args.kubeconfig} does not exist", "give a kubeconfig file"
                )
            config = KubeConfig.from_file(args.kubeconfig)
        else:
            config = KubeConfig.from_env()
        single = config.get(context_name=args.context)
        if single is None:
            raise InvalidInputError(
                "--context", f"no context {args.context!r}", "pick one from the kubeconfig"
            )
        client = Client(config=single, timeout=httpx.Timeout(args.timeout))
        pod_filter: dict[str, Any] = {"namespace": args.namespace or "*"}
        if args.node:
            pod_filter["fields"] = {"spec.nodeName": args.node}
        nodes = [n.to_dict() for n in client.list(Node)]
        pods = [p.to_dict() for p in client.list(Pod, **pod_filter)]
    except ConfigError as exc:
        raise InvalidInputError(
            "KUBECONFIG", f"no usable kubeconfig ({exc})", "set KUBECONFIG or pass --kubeconfig"
        ) from None
    except ApiError as exc:
        raise InvalidInputError(
            "cluster",
            f"the API server refused: {exc.status.message}",
            "check your permissions: list nodes and pods cluster-wide",
        ) from None
    except httpx.HTTPError as exc:
        raise InvalidInputError(
            "cluster",
            f"cannot reach the API server ({exc})",
            "check KUBECONFIG / --context and that the cluster is up",
        ) from None
    return nodes, pods


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


def main(argv: Sequence[str] | None = None) -> int:
    prog = Path(sys.argv[0]).name
    prog = "kubectl gpushare" if prog.startswith("kubectl-") else "gpushare"
    args = _parser(prog).parse_args(argv)
    try:
        if args.timeout <= 0:
            raise InvalidInputError("--timeout", "must be positive", "give seconds, e.g. 10")
        nodes, pods = _read_cluster(args)
        live = _live(args)
    except InvalidInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    view = build_view(nodes, pods, live=live, node_filter=args.node, namespace=args.namespace)
    if args.node and not view:
        print(
            f"error: --node: no node named {args.node!r}; list nodes with kubectl get nodes",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    source = live.source if live is not None else None
    if args.output == "json":
        print(json.dumps(render_json(view, live_source=source), indent=2))
    else:
        sys.stdout.write(render_text(view, live_source=source))
    return 0


if __name__ == "__main__":
    sys.exit(main())
