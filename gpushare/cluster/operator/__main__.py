"""``python -m gpushare.cluster.operator``: the operator on its own (development, tests).

In a deployment the operator runs inside ``gpushare-controller`` (same process and loop).
"""

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from gpushare.api.endpoints import check_agent_url, check_configmap_name
from gpushare.api.errors import InvalidInputError
from gpushare.api.logs import setup_json_logging
from gpushare.cluster.operator.protection import ProtectionPolicy
from gpushare.cluster.operator.runner import run_operator
from gpushare.cluster.operator.settings import DEFAULT_NAMESPACE, OperatorConfig


def parse_args(argv: Sequence[str] | None = None) -> OperatorConfig:
    defaults = OperatorConfig()
    policy = defaults.protection_policy
    parser = argparse.ArgumentParser(
        prog="python -m gpushare.cluster.operator",
        description="Run the GpuShare operator (profiling, packing, latency protection).",
    )
    parser.add_argument(
        "--namespace", default=DEFAULT_NAMESPACE, help="where the profile cache lives"
    )
    parser.add_argument(
        "--agent-url",
        default=defaults.agent_url,
        help="node agent base URL template; {node} and {node_ip} are substituted",
    )
    parser.add_argument(
        "--profile-cache-name",
        default=defaults.cache_configmap,
        help="name of the profile cache ConfigMap in --namespace",
    )
    parser.add_argument(
        "--watch-namespace",
        action="append",
        default=[],
        help="handle only this namespace (repeatable); default: the whole cluster",
    )
    parser.add_argument("--reconcile-interval", type=float, default=defaults.reconcile_interval_s)
    parser.add_argument("--measure-grace", type=float, default=defaults.measure_grace_s)
    parser.add_argument(
        "--profiling-start-timeout", type=float, default=defaults.profiling_start_timeout_s
    )
    parser.add_argument("--profiling-warmup", type=float, default=defaults.profiling_warmup_s)
    parser.add_argument(
        "--no-protection", action="store_true", help="do not run latency protection"
    )
    parser.add_argument("--protection-interval", type=float, default=defaults.protection_interval_s)
    parser.add_argument("--protection-window", type=int, default=defaults.protection_window_s)
    parser.add_argument("--saturation-threshold", type=float, default=policy.saturation_threshold)
    parser.add_argument("--slowdown-bound", type=float, default=policy.slowdown_bound)
    parser.add_argument("--bad-readings", type=int, default=policy.bad_readings)
    parser.add_argument("--cooldown", type=float, default=policy.cooldown_s)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument(
        "--client-log-level",
        default="WARNING",
        help="level of the HTTP client's and Kopf's per-request/per-handler logs",
    )
    args = parser.parse_args(argv)
    if not 0 < args.saturation_threshold <= 1:
        parser.error("--saturation-threshold: must be in (0, 1], e.g. 0.9")
    if args.bad_readings < 1:
        parser.error("--bad-readings: must be at least 1")
    if args.protection_window < 1 or args.reconcile_interval <= 0 or args.protection_interval <= 0:
        parser.error("--protection-window and the intervals must be positive")
    try:
        check_agent_url(args.agent_url)
        check_configmap_name(args.profile_cache_name)
    except InvalidInputError as exc:
        parser.error(str(exc))
    setup_json_logging(component="gpushare-operator", level=args.log_level)
    for noisy in ("httpx", "httpx2", "kopf.objects", "kopf.activities"):
        logging.getLogger(noisy).setLevel(args.client_log_level.upper())
    return OperatorConfig(
        namespace=args.namespace,
        watch_namespaces=tuple(args.watch_namespace),
        agent_url=check_agent_url(args.agent_url),
        cache_configmap=args.profile_cache_name,
        reconcile_interval_s=args.reconcile_interval,
        measure_grace_s=args.measure_grace,
        profiling_start_timeout_s=args.profiling_start_timeout,
        profiling_warmup_s=args.profiling_warmup,
        protection=not args.no_protection,
        protection_interval_s=args.protection_interval,
        protection_window_s=args.protection_window,
        protection_policy=ProtectionPolicy(
            saturation_threshold=args.saturation_threshold,
            slowdown_bound=args.slowdown_bound,
            bad_readings=args.bad_readings,
            cooldown_s=args.cooldown,
        ),
    )


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    asyncio.run(run_operator(settings=config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
