"""The kubelet device plugin for ``gpushare.io/gpu-percent``: 100 slices per GPU.

``devices`` names the slices. What Allocate and GetPreferredAllocation decide is pure logic over
pods and slice IDs: ``matching`` finds the pod an Allocate is for, ``steering`` picks the slices
GetPreferredAllocation offers, ``reconcile`` checks answers against the kubelet's pod-resources
API (``holdings`` keeps both records), ``response`` builds the container's answer; ``allocator``
adds the Kubernetes reads and writes and the state between calls. ``server`` is the gRPC
servicer, ``plugin`` serves it on the kubelet's device-plugin socket directory and keeps it
registered. Kubernetes is reached only through the ``PodSource`` protocol (``pods``),
implemented by ``gpushare.kube.node``.
"""
