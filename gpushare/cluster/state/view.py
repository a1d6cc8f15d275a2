"""The controller's in-memory view of GPUs and the shares placed on them: :class:`ClusterView`.

Fed by watches of nodes (inventory annotation ``gpushare.io/gpus``) and pods (placement
annotations), plus the extender's in-flight reservations. Nothing here is state of record: every
tenant comes from a pod's placement annotations or from a bind in progress in this process, so a
restart rebuilds the same view from the API server.

The view is assembled from parts, one concern each (modules of this package):

- ``nodes``: the nodes' GPU inventories, each node's version (a cache key), and what the
  operator reads of every node (agent address, GPU models);
- ``placements``: which GPUs each pod holds (its tenancy), and so each GPU's tenants;
- ``hosts``: each node's free host CPU and memory (allocatable minus the requests of every pod
  bound there, gpushare's or not: the gpushare policy charges GPU share stranded by CPU or
  memory);
- ``reservations``: binds in progress and filter-time holds, and the pods waiting for their
  Allocate (the bind gate);
- ``shares``: the GpuShares (spec read once, status), and the rules their pods carry;
- ``governance``: which pods a GpuShare governs, and who sits on which GPU (the operator's
  reads);
- ``tenancy``: namespace grants (the tenancy boundary, who may keep others off a GPU);
- ``workload_marks``: workloads the node agents marked exclusive or separated;
- ``pod_mix``: which pods are counted in the pod mix the policy measures against.

What ties them together is the pods as last watched (``pod_facts.PodFacts``, the one typed
projection: the gpushare pods, and the pods naming gpushare-scheduler that a GpuShare may
govern), the watch entry points, which tell every part what changed, and the reads the
extender, the webhook and the operator make. :class:`ClusterView` puts together the modules
that hold them, grouped by what they do:

- ``view_parts``: the parts, the pods, and the steps every change ends with (recounting what a
  pod holds, telling the listeners);
- ``view_reads``: what the extender and the webhook read;
- ``view_operator_reads``: what the operator reads;
- ``view_node_events``: the node and agent Lease watches;
- ``view_pod_events``: the pod, namespace and GpuShare watches;
- ``view_reserving``: the extender's binds in progress.

The controller's informers feed it; the standalone operator feeds the same class from its Kopf
handlers.

All methods are synchronous and the process is single-threaded asyncio: a caller that checks a
fit and reserves without awaiting in between can never oversubscribe a GPU.
"""

from collections.abc import Iterable, Mapping
from typing import Any

from gpushare.cluster.state.pods import pod_key
from gpushare.cluster.state.view_node_events import NodeEvents
from gpushare.cluster.state.view_operator_reads import OperatorReads
from gpushare.cluster.state.view_pod_events import PodEvents
from gpushare.cluster.state.view_reads import ViewReads
from gpushare.cluster.state.view_reserving import Reserving


class ClusterView(NodeEvents, PodEvents, Reserving, ViewReads, OperatorReads):
    """GPUs by node, tenants by GPU, gpushare pods by key: the one view the extender, the
    webhook and the operator share.

    A composition: each part (see the module docstring) owns its state and keeps it up to
    date; the view owns the pods and their tenancies and routes every watch event to the
    parts. The reads the extender makes per node and per GPU (``node``, ``node_for``,
    ``node_versions``, ``tenancy``, ``gpu``...) and ``reserve`` use the parts' dicts directly
    (bound in ``ViewParts.__init__``), so they cost what they would in one class. The methods
    are this class's, only written in the ``view_*`` modules (one base class each): a call
    costs what it did when they were written here.
    """

    def mark_synced(self) -> None:
        """Both kinds are in (a full list of each, or no API server to list from)."""
        self.nodes_synced = self.pods_synced = True
        self._notify_synced()

    def add_listed(
        self, *, nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
    ) -> None:
        """Take in a one-off listing (the standalone operator's, whose watches are Kopf's
        handlers): only the nodes and pods not seen yet, since watch events that came meanwhile
        are newer; no pod events. Then the view is synced."""
        for node in nodes:
            meta = node.get("metadata")
            name = meta.get("name") if isinstance(meta, Mapping) else None
            if isinstance(name, str) and name not in self._inventory.about:
                self.upsert_node(node)
        self._listing = True
        try:
            for pod in pods:
                if self.kept_pod(pod_key(pod)) is None:
                    self.upsert_pod(pod)
        finally:
            self._listing = False
        self.mark_synced()
