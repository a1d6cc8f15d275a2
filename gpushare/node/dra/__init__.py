"""The kubelet DRA plugin of driver ``gpu.gpushare.io`` (the node agent's ``--mode dra``).

``slices`` builds the node's ResourceSlice (one device per GPU, consumable ``gpuPercent`` and
``memory``) and publishes it through the ``SliceStore`` protocol; ``claims`` reads an allocated
ResourceClaim into what one claim gets (GPU, thread %, memory, class), refusing hostile input;
``cdi`` writes the CDI spec the container runtime injects; ``checkpoint`` keeps prepared claims
across restarts; ``driver`` prepares and unprepares claims (MPS limits included); ``server`` is
the gRPC servicers (DRAPlugin v1 and v1beta1, plugin registration) and ``plugin`` serves them
on the kubelet's sockets. Kubernetes is reached only through the ``ClaimSource`` and
``SliceStore`` protocols, implemented by ``gpushare.kube.dra``.
"""
