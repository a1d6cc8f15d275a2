"""Pausing pods: the node agent's side of "pause, don't kill" (docs/node-agent.md, "Pausing a
pod"; the contract: gpushare.api.pause).

The controller asks for a pod to be paused with the annotation ``gpushare.io/pause``; the node
agent freezes the pod's containers through the kernel's cgroup freezer (cgroup v2 or v1, either
kubelet cgroup driver), records the freeze in ``gpushare.io/paused`` and says so in Events,
and thaws the pod when the request goes. A frozen MPS client gives its GPU compute back at once
and loses no work; its GPU memory stays allocated (measured on an H100: docs/packing.md).

Modules, one job each:

- :mod:`.decisions`: what a pod should be and the one step towards it (pure);
- :mod:`.freezer`: a pod's container cgroups, their state, freezing and thawing them;
- :mod:`.pauser`: one pass over the node's pods: steps carried out, annotations, Events, counts;
- :mod:`.loop`: when passes run (a watch of the node's pods, and a resync period);
- :mod:`.metrics`: the ``gpushare_pod_pause*`` series.
"""
