"""What the node agent's parts share: the pod as the agent sees it (``pods``), the container's
MPS answer (``answer``), a pod's GPUs as the exporter sees them (``allocations``), which pod a
process belongs to (``cgroups``), GPU health (``health``), the kubelet's pod-resources API
(``podresources``) and the one restart loop of the kubelet plugins (``serving``). The device
plugin, the DRA plugin, the exporter and the fault monitor import it, never each other."""
