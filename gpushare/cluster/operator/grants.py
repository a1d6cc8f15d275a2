"""What an admin granted a namespace, as the operator reads it when it must say so (the words of
``ProfilingStarted``): from the view's namespace watch in the controller; the standalone
operator, which watches no namespaces, reads the Namespace (gpushare.cluster.state.tenancy)."""

from gpushare.api.names import LABEL_NEIGHBOUR_RULES, NEIGHBOUR_RULES_GRANTED
from gpushare.cluster.state.view import ClusterView
from gpushare.kube.errors import KubeError
from gpushare.kube.operator import KubeApi


async def neighbour_rules(view: ClusterView, kube: KubeApi, namespace: str) -> bool:
    """May the namespace's pods keep others off their GPU (a profiling pod alone)? An unread
    Namespace counts as no: the words then promise less than may happen, never more."""
    if view.tenancies.synced:
        return view.tenancies.neighbour_rules(namespace)
    try:
        labels = await kube.namespace_labels(namespace)
    except KubeError:
        return False
    return labels.get(LABEL_NEIGHBOUR_RULES) == NEIGHBOUR_RULES_GRANTED
