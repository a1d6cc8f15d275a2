"""The controller's one view of the cluster, fed by its watches: nodes and their GPUs, pods and
their placements, reservations, GpuShare rules and namespace tenancies (``view``), with the pod
projection it keeps (``pods``) and the rules it applies (``share_rules``, ``tenancy``,
``host_resources``). docs/architecture.md, "State of record"."""
