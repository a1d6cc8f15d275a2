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
from gpushare.api.flags import flag
from gpushare.api.logs import setup_json_logging
from gpushare.cluster.operator.protection import ProtectionPolicy
from gpushare.cluster.operator.runner import run_operator
from gpushare.cluster.operator.settings import OperatorConfig


def parse_args(argv: Sequence[str] | None = None) -> OperatorConfig:
    parser = argparse.ArgumentParser(
        prog="python -m gpushare.cluster.operator",
        description="Run the GpuShare operator (profiling, packing, latency protection).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    cfg, policy = OperatorConfig, ProtectionPolicy
    flag(parser, cfg, "namespace")
    flag(parser, cfg, "agent_url")
    flag(parser, cfg, "agent_token_file")
    flag(parser, cfg, "cache_configmap", "--profile-cache-name")
    flag(parser, cfg, "watch_namespaces", "--watch-namespace", action="append", default=[])
    flag(parser, cfg, "reconcile_interval_s", "--reconcile-interval", type=float)
    flag(parser, cfg, "measure_grace_s", "--measure-grace", type=float)
    flag(parser, cfg, "profiling_start_timeout_s", "--profiling-start-timeout", type=float)
    flag(parser, cfg, "profiling_warmup_s", "--profiling-warmup", type=float)
    parser.add_argument(
        "--no-protection", action="store_true", help="do not run latency protection"
    )
    parser.add_argument(
        "--dra",
        action="store_true",
        help="also watch gpushare's DRA claims, so DRA-mode pods count where their claims "
        "put them (status.placements, latency protection)",
    )
    flag(parser, cfg, "protection_interval_s", "--protection-interval", type=float)
    flag(parser, cfg, "protection_window_s", "--protection-window", type=int)
    flag(parser, policy, "saturation_threshold", type=float)
    flag(parser, policy, "slowdown_bound", type=float)
    flag(parser, policy, "bad_readings", type=int)
    flag(parser, policy, "cooldown_s", "--cooldown", type=float)
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
    if (
        args.protection_window_s < 1
        or args.reconcile_interval_s <= 0
        or args.protection_interval_s <= 0
    ):
        parser.error("--protection-window and the intervals must be positive")
    try:
        check_agent_url(args.agent_url)
        check_configmap_name(args.cache_configmap)
    except InvalidInputError as exc:
        parser.error(str(exc))
    setup_json_logging(component="gpushare-operator", level=args.log_level)
    for noisy in ("httpx", "httpx2", "kopf.objects", "kopf.activities"):
        logging.getLogger(noisy).setLevel(args.client_log_level.upper())
    return OperatorConfig(
        namespace=args.namespace,
        watch_namespaces=tuple(args.watch_namespaces),
        agent_url=check_agent_url(args.agent_url),
        agent_token_file=args.agent_token_file,
        cache_configmap=args.cache_configmap,
        reconcile_interval_s=args.reconcile_interval_s,
        measure_grace_s=args.measure_grace_s,
        profiling_start_timeout_s=args.profiling_start_timeout_s,
        profiling_warmup_s=args.profiling_warmup_s,
        protection=not args.no_protection,
        dra_claims=args.dra,
        protection_interval_s=args.protection_interval_s,
        protection_window_s=args.protection_window_s,
        protection_policy=ProtectionPolicy(
            saturation_threshold=args.saturation_threshold,
            slowdown_bound=args.slowdown_bound,
            bad_readings=args.bad_readings,
            cooldown_s=args.cooldown_s,
        ),
    )


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    asyncio.run(run_operator(settings=config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
