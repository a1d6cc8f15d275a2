"""The cluster-side controller process: scheduler extender, admission webhook and (hooked in by
``gpushare.cluster.operator``) the Kopf operator, all sharing one watch-fed view of the GPUs.

Only :mod:`gpushare.cluster.kube` talks to the Kubernetes API; everything else works on plain
pod/node dicts and :mod:`gpushare.packing` types, so it is tested without a cluster.
"""
