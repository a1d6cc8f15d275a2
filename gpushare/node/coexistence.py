"""Running beside NVIDIA's device plugin: which GPUs another device plugin already advertises.

The kubelet knows every device each plugin advertises: its PodResources API
``GetAllocatableResources`` lists them per resource name (GA since Kubernetes 1.28). NVIDIA's
device plugin names a GPU by its UUID (``deviceIDStrategy: uuid``, the default; time-slicing
replicas add ``::<n>``) or by its index (``deviceIDStrategy: index``). A GPU found there under
another resource is one gpushare must not advertise: pods asking for ``nvidia.com/gpu`` could
land on it while gpushare shares it.

At start the agent leaves such GPUs out (``gpushare.node.gpu.selection``); afterwards
``OtherPluginWatch`` keeps checking, because the other plugin may register later, and marks a
managed GPU unhealthy (so the kubelet stops giving its slices to new pods) with a Warning Event
until the other plugin stops advertising it. See docs/coexistence.md.
"""

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from gpushare.api.inventory import GpuInfo
from gpushare.api.names import DEVICE_ID_SEPARATOR, GPU_RESOURCES

log = logging.getLogger(__name__)

HEALTH_SOURCE = "other-device-plugin"
NVIDIA_RESOURCE_PREFIX = "nvidia.com/"
Advertised = Sequence[tuple[str, Sequence[str]]]
"""(resource name, device IDs) per resource, as the kubelet reports them."""


def allocatable_devices(*, socket_path: Path, timeout_s: float = 5.0) -> Advertised:
    """The kubelet's ``GetAllocatableResources``: every device plugin's devices by resource.
    Raises grpc.RpcError (or OSError) when the kubelet cannot be asked."""
    import grpc  # noqa: PLC0415  (loaded only where the kubelet socket is used)

    from gpushare.node.core.podresources.v1 import api_pb2, api_pb2_grpc  # noqa: PLC0415

    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        response = stub.GetAllocatableResources(
            api_pb2.AllocatableResourcesRequest(), timeout=timeout_s
        )
    return [(d.resource_name, tuple(d.device_ids)) for d in response.devices]


def other_plugin_gpus(
    gpus: Iterable[GpuInfo],
    advertised: Advertised,
    *,
    own_resources: Sequence[str] = GPU_RESOURCES,
) -> dict[str, str]:
    """GPU UUID -> the resource another plugin advertises it as. UUID device IDs match under
    any resource; bare index IDs only under ``nvidia.com/*`` (other plugins number their own
    devices)."""
    gpus = list(gpus)
    by_uuid = {g.uuid: g for g in gpus}
    by_index = {str(g.index): g for g in gpus}
    found: dict[str, str] = {}
    for resource, device_ids in advertised:
        if resource in own_resources:
            continue
        for device_id in device_ids:
            base = device_id.split(DEVICE_ID_SEPARATOR, 1)[0]
            gpu = by_uuid.get(base)
            if gpu is None and resource.startswith(NVIDIA_RESOURCE_PREFIX):
                gpu = by_index.get(base)
            if gpu is not None:
                found.setdefault(gpu.uuid, resource)
    return found


def startup_claims(gpus: Iterable[GpuInfo], *, socket_path: Path | None) -> dict[str, str]:
    """Other plugins' GPUs when the agent starts; empty (with a warning saying what is not
    checked) when the kubelet cannot be asked."""
    if socket_path is None:
        return {}
    try:
        return other_plugin_gpus(gpus, allocatable_devices(socket_path=socket_path))
    except Exception as exc:  # grpc.RpcError, OSError: the check is advisory
        log.warning(
            "cannot ask the kubelet which GPUs other device plugins advertise (%s: %s); "
            "gpushare assumes none. Mount the kubelet's pod-resources socket to enable the check",
            type(exc).__name__,
            exc,
        )
        return {}


class OtherPluginWatch:
    """Every ``interval_s``: mark a managed GPU unhealthy while another plugin advertises it.

    ``set_problem(uuid, problem)`` is the device plugin's health hook (None clears);
    ``record(reason, message, warning)`` posts a Node Event.
    """

    def __init__(
        self,
        *,
        gpus: Sequence[GpuInfo],
        socket_path: Path,
        set_problem: Callable[[str, str | None], object],
        record: Callable[[str, str, bool], None],
        interval_s: float = 30.0,
        advertised: Callable[[], Advertised] | None = None,
    ) -> None:
        self.gpus = list(gpus)
        self.socket_path = socket_path
        self.set_problem = set_problem
        self.record = record
        self.interval_s = interval_s
        self._advertised = advertised or (lambda: allocatable_devices(socket_path=socket_path))
        self.claimed: dict[str, str] = {}

    def check_once(self) -> dict[str, str]:
        """One check; returns the managed GPUs another plugin advertises now."""
        try:
            now = other_plugin_gpus(self.gpus, self._advertised())
        except Exception as exc:  # the kubelet restarting: keep the last answer
            log.debug("pod-resources check failed: %s", exc)
            return self.claimed
        names = {g.uuid: f"GPU {g.index} ({g.uuid})" for g in self.gpus}
        for uuid, resource in now.items():
            if uuid in self.claimed:
                continue
            message = (
                f"{names[uuid]} is now also advertised by another device plugin as {resource}: "
                "gpushare stops offering it to new pods (pods already on it keep running). "
                "Exclude it from one of the plugins (gpushare: --gpus / node.gpus) and restart "
                "the gpushare agent"
            )
            log.error(message)
            self.set_problem(uuid, f"advertised by another device plugin as {resource}")
            self.record("GpuAdvertisedByOtherPlugin", message, True)
        for uuid in set(self.claimed) - set(now):
            message = f"{names[uuid]} is no longer advertised by another device plugin"
            log.warning(message)
            self.set_problem(uuid, None)
            self.record("GpuNoLongerAdvertisedByOtherPlugin", message, False)
        self.claimed = now
        return now

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s):
            self.check_once()

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(
            target=self.run, args=(stop,), name="other-plugin-watch", daemon=True
        )
        thread.start()
        return thread
