"""Publishing the node: what the agent tells the cluster about its GPUs and itself.

On start and on every health or daemon change the agent merge-patches its Node: the inventory
(annotation ``gpushare.io/gpus``), ``gpushare.io/mps-capable`` and ``gpushare.io/simulated``
labels, its mode and readiness (``gpushare.io/agent-ready``, which the extender waits on); in
DRA mode also the node's ResourceSlice (docs/node-agent.md, "Node publishing"). And it keeps
its Lease renewed (``AgentLease``), so the controller notices within seconds when it is gone
(gpushare.api.agent_lease).
"""

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from gpushare.api.agent_lease import AGENT_LEASE_DURATION_S, agent_lease_name
from gpushare.api.inventory import GpuInfo, dump_inventory
from gpushare.api.names import (
    ANN_AGENT_MODE,
    ANN_AGENT_READY,
    ANN_NODE_GPUS,
    LABEL_MPS_CAPABLE,
    LABEL_SIMULATED,
)

log = logging.getLogger(__name__)

# Volta (7.0) and newer run MPS with execution-resource provisioning (active-thread %).
MPS_MIN_CAPABILITY = (7, 0)


class SliceStore(Protocol):
    """The node's ResourceSlice (gpushare.node.dra.slices.SlicePublisher), DRA mode only."""

    def publish(self, gpus: list[GpuInfo]) -> object: ...


def mps_capable(gpus: list[GpuInfo]) -> bool:
    def capability(text: str) -> tuple[int, int]:
        major, _, minor = text.partition(".")
        return (int(major), int(minor or 0)) if major.isdigit() else (0, 0)

    return bool(gpus) and all(capability(g.compute_capability) >= MPS_MIN_CAPABILITY for g in gpus)


class NodePublisher:
    """Writes the Node's GPU annotations and labels when they change (``step``, every second
    from the agent's publish loop) or when asked (``request``). Thread-safe."""

    def __init__(
        self,
        *,
        node_name: str,
        mode: str,
        simulated: bool,
        kube: Any,
        inventory: Callable[[], list[GpuInfo]],
        not_ready_reason: Callable[[], str | None],
        slices: SliceStore | None = None,
    ) -> None:
        """``kube`` publishes (gpushare.kube.node.NodeKube.publish_node)."""
        self.node_name = node_name
        self.mode = mode
        self.simulated = simulated
        self.kube = kube
        self.inventory = inventory
        self.not_ready_reason = not_ready_reason
        self.slices = slices
        self._needed = threading.Event()
        self._published_ready = ""

    def request(self) -> None:
        """Publish at the next step (a GPU's health or daemon changed)."""
        self._needed.set()

    def node_metadata(self) -> tuple[dict[str, str], dict[str, str | None]]:
        gpus = self.inventory()
        labels: dict[str, str | None] = {
            LABEL_MPS_CAPABLE: "true" if mps_capable(gpus) else None,
            LABEL_SIMULATED: "true" if self.simulated else None,
        }
        ready = "true" if self.not_ready_reason() is None else "false"
        annotations = {
            ANN_NODE_GPUS: dump_inventory(gpus),
            ANN_AGENT_READY: ready,
            ANN_AGENT_MODE: self.mode,
        }
        return annotations, labels

    def publish(self) -> None:
        annotations, labels = self.node_metadata()
        self._published_ready = annotations[ANN_AGENT_READY]
        self.kube.publish_node(annotations=annotations, labels=labels)
        gpus = self.inventory()
        log.info("published %d GPU(s) on node %s", len(gpus), self.node_name)
        if self.slices is not None:
            try:
                self.slices.publish(gpus)
            except Exception as exc:
                log.warning("could not publish this node's ResourceSlice (%s); retrying", exc)
                self._needed.set()

    def publish_stopping(self) -> None:
        """Say the agent is not ready before it exits, so no pod is placed here in the
        seconds until the next agent has registered with the kubelet (a pod placed then
        waits out the kubelet's retry back-off: 71 s measured in DRA mode, an H200 run of
        tests/gpu_cluster). Only the readiness annotation: the inventory stays as published."""
        if self.kube is None:
            return
        try:
            self.kube.publish_node(annotations={ANN_AGENT_READY: "false"}, labels={})
            self._published_ready = "false"
            log.info("published node %s not ready: the agent is stopping", self.node_name)
        except Exception as exc:
            log.warning(
                "could not say node %s is not ready before stopping: %s", self.node_name, exc
            )

    def step(self) -> None:
        """Publish when readiness flipped or a change asked for it."""
        ready = "true" if self.not_ready_reason() is None else "false"
        if ready != self._published_ready:
            log.info("node agent %s", "ready" if ready == "true" else "not ready")
            self._needed.set()
        if self._needed.is_set():
            self._needed.clear()
            self.publish()


class LeaseWriter(Protocol):
    """Renews the agent's Lease (gpushare.kube.node.NodeKube.renew_agent_lease)."""

    def renew_agent_lease(self, *, namespace: str, name: str, duration_s: int) -> None: ...


class AgentLease:
    """This node's agent's Lease, renewed by ``renew`` (every AGENT_LEASE_RENEW_S from the
    agent's lease loop, which starts before anything else)."""

    def __init__(self, *, node_name: str, namespace: str, kube: LeaseWriter | None) -> None:
        self.namespace = namespace
        self.name = agent_lease_name(node_name)
        self.kube = kube if namespace and self.name is not None else None
        self.renewals = 0
        self._failing = False
        if namespace and self.name is None:
            log.warning(
                "node name too long for an agent Lease; the controller judges this node "
                "without one",
                extra={"node": node_name},
            )

    def renew(self) -> None:
        if self.kube is None or self.name is None:
            return
        try:
            self.kube.renew_agent_lease(
                namespace=self.namespace, name=self.name, duration_s=AGENT_LEASE_DURATION_S
            )
        except Exception as exc:
            if not self._failing:
                log.warning(
                    "could not renew this agent's Lease %s/%s (%s); the controller stops "
                    "placing pods here if it stays so",
                    self.namespace,
                    self.name,
                    exc,
                )
            self._failing = True
            return
        if self._failing:
            log.info("agent Lease %s/%s renewed again", self.namespace, self.name)
        self._failing = False
        self.renewals += 1
