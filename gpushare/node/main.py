"""``gpushare-node-agent``: the per-node DaemonSet process (device plugin + MPS manager +
node publishing + metrics). Thin: parses flags, builds the parts, runs NodeAgent."""

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.flags import flag
from gpushare.api.logs import setup_json_logging
from gpushare.api.names import LABEL_MANAGED_GPUS
from gpushare.node.agent import NodeAgent
from gpushare.node.coexistence import HEALTH_SOURCE as OTHER_PLUGIN_HEALTH
from gpushare.node.coexistence import OtherPluginWatch, startup_claims
from gpushare.node.core.answer import DeviceNode
from gpushare.node.core.vendor_cdi import parse_mode as parse_vendor_cdi
from gpushare.node.gpu.backend import GpuBackend
from gpushare.node.gpu.factory import open_backend
from gpushare.node.gpu.selection import (
    REASON_NOT_SELECTED,
    GpuList,
    SkippedGpu,
    parse_gpu_label,
    parse_gpu_list,
    select_gpus,
)
from gpushare.node.settings import AgentSettings
from gpushare.packing.tenancy import TENANCY_MODES

if TYPE_CHECKING:
    from gpushare.api.pod import PodInfo
    from gpushare.kube.node import NodeKube

log = logging.getLogger("gpushare.node")


AGENT_FLAGS: dict[str, dict[str, Any]] = {
    "mode": {"choices": ("deviceplugin", "dra")},
    "kubelet_root": {"type": Path},
    "cdi_dir": {"type": Path},
    "vendor_cdi": {"type": parse_vendor_cdi},
    "device_plugin_dir": {"type": Path},
    "plugin_endpoint": {},
    "opportunistic_plugin_endpoint": {},
    "mps_root": {"type": Path},
    "mps_shm": {"choices": ("private", "host")},
    "require_exclusive_process": {"action": "store_true"},
    "set_exclusive_process": {"action": "store_true"},
    "mps_daemons": {"choices": ("own", "launcher")},
    "tenancy": {"choices": TENANCY_MODES},
    "lease_namespace": {},
    "stop_mps_on_exit": {"action": "store_true"},
    "metrics_host": {},
    "metrics_port": {"type": int},
    "metrics_auth": {"choices": ("tokenreview", "none")},
    "pod_resources_socket": {"type": Path},
    "exclusive_after_faults": {"type": int},
    "cgroup_root": {"type": Path},
}
"""AgentSettings fields set by a flag of the same name (gpushare.api.flags: default and --help
from the field)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpushare-node-agent",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=(
            "gpushare node agent: advertises each GPU as 100 slices of gpushare.io/gpu-percent "
            "to the kubelet, runs one MPS control daemon per GPU, answers Allocate with the "
            "pod's GPU, MPS pipe, active-thread percentage and memory limit, and publishes the "
            "node's GPU inventory; with --mode dra it is the kubelet DRA plugin of driver "
            "gpu.gpushare.io instead. Logs are JSON lines on stderr."
        ),
    )
    _add_node_flags(parser)
    for name, kwargs in AGENT_FLAGS.items():
        flag(parser, AgentSettings, name, **kwargs)
    _add_scope_flags(parser)
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="default: %(default)s",
    )
    return parser


def _add_node_flags(parser: argparse.ArgumentParser) -> None:
    """The flags saying which GPUs' backend, which node and which cluster."""
    parser.add_argument(
        "--backend",
        default="nvml",
        help='GPU backend: "nvml" (real GPUs) or "simulated:<count>x<model>", e.g. '
        '"simulated:2xH100-80GB" (fake GPUs that say so in logs, labels and metrics); '
        "default: %(default)s",
    )
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME") or socket.gethostname(),
        help="Kubernetes node name (default: $NODE_NAME, else the host name: %(default)s)",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="kubeconfig file (default: in-cluster service account, else $KUBECONFIG or "
        "~/.kube/config)",
    )


def _add_scope_flags(parser: argparse.ArgumentParser) -> None:
    """The flags saying what the agent serves and which GPUs it leaves to others."""
    parser.add_argument(
        "--no-exporter",
        action="store_true",
        help="do not wire in gpushare.node.exporter (serve only the agent's own metrics)",
    )
    parser.add_argument(
        "--gpus",
        default="all",
        help='GPUs gpushare manages on this node: "all", or indexes and/or UUIDs separated by '
        "commas; the others are left to other device plugins. MIG-enabled GPUs and GPUs "
        "another device plugin advertises are always left out (docs/coexistence.md) "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--other-plugin-check-seconds",
        type=float,
        default=30.0,
        help="how often to ask the kubelet whether another device plugin advertises a GPU "
        "gpushare manages (it then stops offering it); 0 checks only at start "
        "(default: %(default)s)",
    )


def _device_nodes(backend: GpuBackend) -> Callable[[str], list[DeviceNode]] | None:
    paths = getattr(backend, "device_paths", None)
    if backend.simulated or paths is None:
        return None

    def lookup(uuid: str) -> list[DeviceNode]:
        return [DeviceNode(container_path=p, host_path=p, permissions="rw") for p in paths(uuid)]

    return lookup


def _label_selection(kube: "NodeKube[PodInfo]", *, default: GpuList | None) -> GpuList | None:
    """The node label gpushare.io/managed-gpus if set, else --gpus. An unreadable node (API
    down at start) falls back to --gpus with a warning; a bad label value is refused."""
    try:
        labels = kube.node_labels()
    except Exception as exc:
        log.warning("cannot read this node's labels (%s); using --gpus", exc)
        return default
    value = labels.get(LABEL_MANAGED_GPUS)
    if value is None:
        return default
    log.info("node label %s=%s selects the GPUs gpushare manages", LABEL_MANAGED_GPUS, value)
    return parse_gpu_label(value)


def _node_events(kube: "NodeKube[PodInfo]") -> Callable[[str, str, bool], None]:
    """Post a Node Event; a failure is logged, never raised (the log line says it anyway)."""

    def record(reason: str, message: str, warning: bool) -> None:
        try:
            kube.record_event(pod=None, reason=reason, message=message, warning=warning)
        except Exception as exc:
            log.warning("could not record Event %s: %s", reason, exc)

    return record


def _report_selection(
    found: GpuBackend,
    backend: GpuBackend,
    wanted: GpuList | None,
    skipped: list[SkippedGpu],
    record: Callable[[str, str, bool], None],
) -> None:
    """Say which GPUs gpushare leaves alone and why: a log line and a Node Event each."""
    for s in skipped:
        log.warning("%s", s.message, extra={"gpu_uuid": s.gpu.uuid, "reason": s.reason})
        record(f"Gpu{s.reason}", s.message, s.reason != REASON_NOT_SELECTED)
    if wanted is not None:
        present = found.inventory()
        unknown = sorted(str(i) for i in wanted.indexes - {g.index for g in present})
        unknown += sorted(wanted.uuids - {g.uuid for g in present})
        if unknown:
            log.warning("--gpus names GPUs this node does not have: %s", ", ".join(unknown))
    managed = backend.inventory()
    if not managed:
        message = "gpushare manages no GPU on this node: every GPU is excluded (see above)"
        log.error(message)
        record("NoGpuManaged", message, True)
    else:
        log.info("managing %d GPU(s): %s", len(managed), ", ".join(g.uuid for g in managed))


def _settings(args: argparse.Namespace) -> AgentSettings:
    """The agent's settings from its flags (a negative --exclusive-after-faults is 0)."""
    flagged = {name: getattr(args, name) for name in AGENT_FLAGS}
    flagged["exclusive_after_faults"] = max(0, args.exclusive_after_faults)
    return AgentSettings(node_name=args.node_name, exporter=not args.no_exporter, **flagged)


def _watch_other_plugins(
    args: argparse.Namespace,
    backend: GpuBackend,
    agent: NodeAgent,
    record: Callable[[str, str, bool], None],
    stop: threading.Event,
) -> None:
    """When the kubelet's pod-resources socket is known and the check is on: watch for
    another device plugin advertising a GPU gpushare manages (that GPU then has a problem)."""
    if args.other_plugin_check_seconds > 0 and args.pod_resources_socket is not None:
        OtherPluginWatch(
            gpus=backend.inventory(),
            socket_path=args.pod_resources_socket,
            set_problem=lambda uuid, problem: agent.health.set_problem(
                uuid, OTHER_PLUGIN_HEALTH, problem
            ),
            record=record,
            interval_s=args.other_plugin_check_seconds,
        ).start(stop)


def _handle_signals(agent: NodeAgent, stop: threading.Event) -> None:
    """SIGTERM and SIGINT stop the agent; SIGHUP serves its kubelet plugin again."""

    def on_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %s: shutting down", signal.Signals(signum).name)
        stop.set()

    def on_hup(_signum: int, _frame: FrameType | None) -> None:
        log.info("SIGHUP: re-serving and re-registering the kubelet plugin")
        agent.request_restart()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, on_hup)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_json_logging(component="gpushare-node-agent", level=args.log_level)
    if args.metrics_port < 0 or args.metrics_port > 65535:
        print("gpushare-node-agent: --metrics-port must be 0..65535", file=sys.stderr)
        return 2
    try:
        wanted = parse_gpu_list(args.gpus)
        found = open_backend(args.backend, node_name=args.node_name)
    except InvalidInputError as exc:
        print(f"gpushare-node-agent: {exc}", file=sys.stderr)
        return 2
    from gpushare.api.pod import pod_info  # noqa: PLC0415
    from gpushare.kube.node import NodeKube  # noqa: PLC0415  (keeps --help fast)

    kube = NodeKube(node_name=args.node_name, project=pod_info, kubeconfig=args.kubeconfig)
    record = _node_events(kube)
    try:
        wanted = _label_selection(kube, default=wanted)
    except InvalidInputError as exc:
        print(f"gpushare-node-agent: {exc}", file=sys.stderr)
        record("InvalidManagedGpus", str(exc), True)
        return 2
    backend, skipped = select_gpus(
        found,
        wanted=wanted,
        other_plugins=startup_claims(found.inventory(), socket_path=args.pod_resources_socket),
    )
    _report_selection(found, backend, wanted, skipped, record)
    settings = _settings(args)
    agent = NodeAgent(
        settings,
        backend=backend,
        kube=kube,
        device_nodes=_device_nodes(backend),
        authorize=kube.access_reviewer().review if settings.metrics_auth != "none" else None,
    )
    stop = threading.Event()
    _watch_other_plugins(args, backend, agent, record, stop)
    _handle_signals(agent, stop)
    try:
        agent.run(stop)
    finally:
        kube.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
