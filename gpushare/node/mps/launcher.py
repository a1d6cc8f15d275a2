"""``gpushare-mps-launcher``: starts MPS control daemons when the node agent asks, from a
container that does not restart with the agent's.

A runtime ends every process of a stopped container, so daemons the agent started itself died
whenever its container restarted, and running pods lost their MPS server (two H200s,
bench/results/gpu-cluster.md). The chart runs this process in a DaemonSet of its own
(``<release>-mps-daemons``, updateStrategy OnDelete; NVML backend), so rolling, deleting or
killing the agent leaves it and its daemons running; the agent runs with ``--mps-daemons
launcher``. It only starts (or adopts) a daemon per request (gpushare.node.mps.launch); health
checks, limits and every other decision stay with the agent. When this container stops, its
daemons stop with it (docs/node-agent.md, "MPS daemons").
"""

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from gpushare.api.logs import setup_json_logging
from gpushare.node.mps.launch import answer, pending_requests
from gpushare.node.mps.manager import MpsManager
from gpushare.node.mps.status import MpsError

log = logging.getLogger("gpushare.node.mps.launcher")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpushare-mps-launcher",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=(
            "Starts one nvidia-cuda-mps-control daemon per GPU when the gpushare node agent "
            "(--mps-daemons launcher) asks, by a launch-request file in <mps-root>/<gpu uuid>/, "
            "so the daemons outlive restarts of the agent. Run it in a pod of its own (the "
            "chart's <release>-mps-daemons DaemonSet) with the agent's MPS root, the host PID "
            "namespace, the GPU devices and driver tools. Logs are JSON lines on stderr."
        ),
    )
    parser.add_argument(
        "--mps-root",
        type=Path,
        default=Path("/run/gpushare/node/mps"),
        help="the agent's --mps-root: holds <gpu uuid>/{pipe,log,shm}",
    )
    parser.add_argument(
        "--mps-shm",
        choices=("private", "host"),
        default="private",
        help="the agent's --mps-shm: private gives each daemon <mps-root>/<uuid>/shm as its "
        "/dev/shm (needs CAP_SYS_ADMIN); host shares the host's",
    )
    parser.add_argument(
        "--poll-seconds",
        type=float,
        default=0.2,
        help="how often <mps-root> is read for requests",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR")
    )
    return parser


def serve_once(manager: MpsManager) -> int:
    """Answer every pending request; how many were answered."""
    requests = pending_requests(manager.root)
    for gpu_dir, request_id in requests:
        uuid = gpu_dir.name
        try:
            pid = manager.ensure_daemon(uuid)
        except MpsError as exc:
            log.error("MPS daemon for %s could not start: %s", uuid, exc, extra={"gpu_uuid": uuid})
            answer(gpu_dir, request_id, error=str(exc))
            continue
        except Exception as exc:  # one GPU's failure must not end the loop
            log.exception("MPS daemon for %s: unexpected failure", uuid, extra={"gpu_uuid": uuid})
            answer(gpu_dir, request_id, error=f"launcher failure: {exc}")
            continue
        log.info("MPS daemon for %s running (pid %d)", uuid, pid, extra={"gpu_uuid": uuid})
        answer(gpu_dir, request_id, pid=pid)
    return len(requests)


def serve(manager: MpsManager, stop: threading.Event, *, poll_s: float) -> None:
    """Answer requests until ``stop`` is set."""
    while not stop.is_set():
        serve_once(manager)
        stop.wait(poll_s)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_json_logging(component="gpushare-mps-launcher", level=args.log_level)
    if not 0.01 <= args.poll_seconds <= 60:
        print("gpushare-mps-launcher: --poll-seconds must be 0.01..60", file=sys.stderr)
        return 2
    args.mps_root.mkdir(parents=True, exist_ok=True)
    manager = MpsManager(root=args.mps_root, simulated=False, shm_mode=args.mps_shm)
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping; the daemons stop with this container", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("serving MPS launch requests under %s (shm %s)", args.mps_root, args.mps_shm)
    serve(manager, stop, poll_s=args.poll_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
