"""The controller's one view of the cluster, fed by its watches: ``view.ClusterView``, assembled
from one part per concern: nodes and their GPUs (``nodes``), which GPUs each pod holds
(``placements``), free host CPU and memory (``hosts``), binds in progress and filter-time holds
(``reservations``), GpuShares and their pods' rules (``shares``), node agents' workload marks
(``workload_marks``) and the pod mix counting (``pod_mix``); with the pure readers and rules they
apply (``pods``, ``share_rules``, ``tenancy``, ``host_resources``). docs/architecture.md, "State
of record"."""
