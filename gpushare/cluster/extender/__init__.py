"""The scheduler extender: kube-scheduler's filter, prioritize and bind verbs (``verbs``), the
answers kept per node state (``answers``), the nodes filter offered a pod (``offers``) and the
requeue of pods refused while hidden capacity was held (``requeue``). docs/scheduling.md."""
