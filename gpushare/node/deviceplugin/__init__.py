"""The kubelet device plugin for ``gpushare.io/gpu-percent``: 100 slices per GPU.

``devices`` names the slices, ``allocation`` decides (pure logic over pods and slice IDs),
``server`` is the gRPC servicer, ``plugin`` serves it on the kubelet's device-plugin socket
directory and keeps it registered. Kubernetes is reached only through the ``PodSource``
protocol, implemented by ``gpushare.kube.node``.
"""
