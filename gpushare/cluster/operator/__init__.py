"""The GpuShare operator (Kopf): profiles jobs, packs them by profile, protects latency pods.

``handlers`` only registers Kopf handlers; the work is in ``profiling`` and ``protection``
(pure decisions), ``reconcile`` and ``guard`` (carrying them out), ``kube`` (the Kubernetes
API) and ``profiler_client`` (the node agents). What it knows of the cluster it reads from the
controller's one state (:mod:`gpushare.cluster.state`), as the extender and the webhook do.
``runner.run_operator`` starts it inside the controller's event loop; the tests' standalone
operator (``python -m tests.fixtures.standalone_operator``) runs it on its own, its Kopf
handlers feeding a state of the same class.
"""
