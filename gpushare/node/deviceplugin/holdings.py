"""What the kubelet holds, and what this plugin answered: the two records that tell a pod the
kubelet forgot (it died between our Allocate answer and its checkpoint) from one it keeps.

``kubelet_held`` asks the kubelet's pod-resources API (v1 ``List``) which pods hold our slices.
``AnswerBook`` remembers, per pod UID, the slices each Allocate answer covered and under which
kubelet (its socket's inode and change time), in memory and in a small JSON file that outlives
an agent restart. The file lives in a subdirectory of the device-plugin directory: a new kubelet
deletes every plain file there except its own checkpoint, but leaves directories alone.
"""

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from gpushare.api.names import GPU_RESOURCES, RESOURCE_GPU_PERCENT

log = logging.getLogger(__name__)

STATE_DIR = "gpushare"
STATE_FILE = "allocations.json"
KEEP_S = 300.0
"""Answers for pods no longer on the node are dropped after this long."""


def kubelet_identity(socket_path: Path) -> str | None:
    """The running kubelet, as its registration socket's inode and change time (a new kubelet
    makes a new socket; the inode number alone may be reused)."""
    try:
        info = socket_path.stat()
    except OSError:
        return None
    return f"{info.st_ino}:{info.st_ctime_ns}"


def kubelet_held(
    *, socket_path: Path, resources: Sequence[str] = GPU_RESOURCES, timeout_s: float = 2.0
) -> dict[str, tuple[str, ...]]:
    """``namespace/name`` -> the device IDs of ``resources`` the kubelet holds for that pod (all its
    containers), for every pod the kubelet lists; a pod holding none maps to ``()``. A pod the
    kubelet does not list is not known to it yet (a restarted kubelet lists pods as it learns
    them from the API server, with the devices its checkpoint kept for them), which is not the
    same as holding nothing. Raises grpc.RpcError when the kubelet does not answer."""
    import grpc  # noqa: PLC0415  (loaded only where the kubelet socket is used)

    from gpushare.node.core.podresources.v1 import api_pb2, api_pb2_grpc  # noqa: PLC0415

    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        response = stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout_s)
    held: dict[str, tuple[str, ...]] = {}
    for pod in response.pod_resources:
        ids = [
            device
            for container in pod.containers
            for devices in container.devices
            if devices.resource_name in resources
            for device in devices.device_ids
        ]
        held[f"{pod.namespace}/{pod.name}"] = tuple(sorted(ids))
    return held


def kubelet_allocatable(
    *, socket_path: Path, resource: str = RESOURCE_GPU_PERCENT, timeout_s: float = 2.0
) -> int:
    """How many ``resource`` device IDs the kubelet itself counts as allocatable (pod-resources
    v1 ``GetAllocatableResources``): the view its admission uses, current as soon as a plugin's
    ListAndWatch answered, while the node object follows on the kubelet's status period.
    Raises grpc.RpcError when the kubelet does not answer."""
    import grpc  # noqa: PLC0415  (loaded only where the kubelet socket is used)

    from gpushare.node.core.podresources.v1 import api_pb2, api_pb2_grpc  # noqa: PLC0415

    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        response = stub.GetAllocatableResources(
            api_pb2.AllocatableResourcesRequest(), timeout=timeout_s
        )
    return sum(len(d.device_ids) for d in response.devices if d.resource_name == resource)


@dataclass(frozen=True)
class Answer:
    """One Allocate answered for a pod."""

    uid: str
    pod: str
    """namespace/name."""
    devices: tuple[str, ...]
    """The slice IDs the answer covered, sorted."""
    kubelet: str | None
    """kubelet_identity() of the kubelet that asked (None: unknown)."""
    at: float
    """Wall-clock time of the answer (seconds since the epoch)."""
    placement: tuple[tuple[str, str], ...] = ()
    """The placement annotations the answer's environment carries (GPU, active-thread
    percentage, memory limit); empty when not recorded."""
    verified: bool = True
    """False while it is not known that the kubelet gave the answer to the pod it was meant
    for: several pods of the same size waited with different placements, or none waited."""


class AnswerBook:
    """Answers by pod UID, saved to ``path`` (when given) after every change. Not thread-safe:
    the Allocator calls it under its lock."""

    def __init__(self, *, path: Path | None = None) -> None:
        self.path = path
        self._answers: dict[str, Answer] = {}
        if path is not None:
            self._answers = _load(path)

    def __contains__(self, uid: object) -> bool:
        return uid in self._answers

    def get(self, uid: str) -> Answer | None:
        return self._answers.get(uid)

    def all(self) -> Mapping[str, Answer]:
        return dict(self._answers)

    def record(self, answer: Answer, *, live: Iterable[str] | None = None) -> None:
        """Remember ``answer``; forget old answers for pods not in ``live`` (UIDs on the node)."""
        self._answers[answer.uid] = answer
        if live is not None:
            keep = set(live)
            cutoff = time.time() - KEEP_S
            for uid, old in list(self._answers.items()):
                if uid not in keep and old.at < cutoff:
                    del self._answers[uid]
        self._save()

    def unverified(self) -> list[Answer]:
        return [a for a in self._answers.values() if not a.verified]

    def settle(self, answer: Answer, *, uid: str, pod: str) -> None:
        """The kubelet gave ``answer`` to pod ``uid``: it is that pod's, and verified."""
        self._answers.pop(answer.uid, None)
        self._answers[uid] = replace(answer, uid=uid, pod=pod, verified=True)
        self._save()

    def confirm(
        self, uids_devices: Mapping[str, tuple[str, tuple[str, ...]]], kubelet: str
    ) -> None:
        """The kubelet ``kubelet`` holds these pods (uid -> (pod, devices)): no need to ask
        again while it runs."""
        if not uids_devices:
            return
        now = time.time()
        for uid, (pod, devices) in uids_devices.items():
            old = self._answers.get(uid)
            self._answers[uid] = (
                replace(old, devices=devices, kubelet=kubelet)
                if old is not None
                else Answer(uid, pod, devices, kubelet, now)
            )
        self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        data = {
            "version": 1,
            "answers": [
                {**asdict(a), "placement": dict(a.placement)} for a in self._answers.values()
            ],
        }
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data, sort_keys=True))
            tmp.replace(self.path)
        except OSError as exc:
            log.warning("could not save Allocate answers to %s: %s", self.path, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()


def _load(path: Path) -> dict[str, Answer]:
    """Answers saved by an earlier agent; an unreadable file is logged and ignored (the
    kubelet's pod-resources answer still guards every decision that depends on it)."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable Allocate answers in %s: %s", path, exc)
        return {}
    answers: dict[str, Answer] = {}
    for item in raw.get("answers", []) if isinstance(raw, dict) else []:
        try:
            answer = Answer(
                uid=str(item["uid"]),
                pod=str(item["pod"]),
                devices=tuple(str(d) for d in item["devices"]),
                kubelet=None if item.get("kubelet") is None else str(item["kubelet"]),
                at=float(item["at"]),
                placement=tuple(
                    (str(k), str(v)) for k, v in dict(item.get("placement") or {}).items()
                ),
                verified=bool(item.get("verified", True)),
            )
        except (KeyError, TypeError, ValueError):
            continue
        answers[answer.uid] = answer
    if answers:
        log.info("loaded %d Allocate answer(s) from %s", len(answers), path)
    return answers
