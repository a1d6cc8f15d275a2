"""kube-scheduler's HTTP extender: filter, prioritize, preempt and bind for gpushare pods.

The verbs live by job -- :mod:`~gpushare.cluster.extender.filtering` (filter, prioritize),
:mod:`~gpushare.cluster.extender.preemption` (preempt),
:mod:`~gpushare.cluster.extender.binding` (bind) -- over the state they share
(:mod:`~gpushare.cluster.extender.base`); the wire format is
:mod:`~gpushare.cluster.extender.args`. The HTTP layer (``gpushare.cluster.server``) only
parses and times (docs/scheduling.md).
"""

from gpushare.cluster.extender.binding import BindVerbs
from gpushare.cluster.extender.filtering import FilterVerbs
from gpushare.cluster.extender.preemption import PreemptVerbs


class Extender(FilterVerbs, PreemptVerbs, BindVerbs):
    """The four verbs over one view."""
