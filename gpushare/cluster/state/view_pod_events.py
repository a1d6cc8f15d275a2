"""Pod, namespace and GpuShare watch events into the view: :class:`PodEvents`.

Each watched pod is read once (``pod_facts.facts``); every pod's host resources are counted
(``hosts``) and it is counted in the pod mix (``pod_mix``); the view keeps the pods gpushare
places, with their GpuShare rules (``shares``) and tenancy (``tenancy``), and the governable
others. A namespace's labels change its pods' tenancy and rule grants.
"""

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from gpushare.cluster.state.host_resources import pod_requests
from gpushare.cluster.state.pod_facts import PodFacts, facts, frozen_demand, kept, ours
from gpushare.cluster.state.pods import pod_key
from gpushare.cluster.state.share_rules import NO_RULES, with_profile
from gpushare.cluster.state.shares import ShareSummary, read_pod_rules
from gpushare.cluster.state.view_reads import ViewReads


class PodEvents(ViewReads):
    """The view's entry points for the pod, namespace and GpuShare watches."""

    # ---- pods ----------------------------------------------------------------------------

    def upsert_pod(self, pod: Mapping[str, Any]) -> PodFacts | None:
        """Take a watched pod in; returns what was read (None for pods gpushare does not place
        on GPUs: of those only the host resources they take are kept)."""
        f = facts(pod)
        cpu, memory = pod_requests(pod)
        self._hosts.bind(f.key, None if f.finished else f.node, cpu, memory)
        placed = ours(f)
        self._mix_count.count(
            self.mix, pod, f, ours=placed, cpu=cpu, memory=memory, gpu_nodes=self._nodes
        )
        if not placed:
            self._forget(f.key)
            if kept(f):
                self._governable[f.key] = f
                self._pod_event(f)
            else:
                self._governable.pop(f.key, None)
            return None
        self._governable.pop(f.key, None)
        namespace = f.key.partition("/")[0]
        rules = read_pod_rules(pod, granted=self.tenancies.neighbour_rules(namespace))
        if f.demand is not None:
            demand = self.with_tenancy(with_profile(f.demand, rules), namespace)
            if demand is not f.demand:  # most pods: unchanged, and a copy of the facts costs
                f = replace(f, demand=demand)
        f = frozen_demand(self._pods.get(f.key), f)
        self._set_rules(f.key, rules)
        self._pods[f.key] = f
        self._reservations.track_awaiting(f.key, f)
        res = self._reserved.get(f.key)
        if res is not None and (
            f.uid != res.uid
            or f.finished
            or (
                f.node == res.node
                and f.placement is not None
                and f.placement.gpu_uuids == res.assignment.gpu_uuids
            )
        ):
            # Bound with our annotations (or gone): the annotations are the record now.
            self._reservations.drop(f.key)
        self._placements.seen(f.key, f)
        self._apply(f.key)
        self._pod_event(f)
        return f

    def delete_pod(self, key: str) -> None:
        last = self._pods.get(key) or self._governable.pop(key, None)
        self._hosts.unbind(key)
        self._mix_count.forget(key, self.mix)
        self._forget(key)
        if last is not None:
            self._pod_event(last)

    def _forget(self, key: str) -> None:
        """Drop what the view keeps of a pod on GPUs (its host resources follow what
        ``delete_pod`` or ``upsert_pod`` told ``HostUsage``)."""
        had = key in self._pods or key in self._reserved
        self._pods.pop(key, None)
        self._placements.promoted.discard(key)
        self._placements.pausing.pop(key, None)
        self._set_rules(key, NO_RULES)
        self._reservations.track_awaiting(key, None)
        self._reservations.drop(key)
        self._apply(key)
        if had:
            self._changed("pod", key)

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """A full list: gpushare pods missing from it are gone."""
        seen: set[str] = set()
        self._listing = True
        try:
            for pod in pods:
                # A pod held out keeps what the view had of it (it is seen, so not gone).
                seen.add(pod_key(pod))
                self.quarantine.take("Pod", pod, self.upsert_pod)
            gone = {
                k
                for k in (
                    *self._pods,
                    *self._governable,
                    *self._hosts.bound,
                    *self._mix_count.counted,
                )
                if k not in seen
            }
            for key in gone:
                self.delete_pod(key)
        finally:
            self._listing = False
        self.pods_synced = True
        self._notify_synced()

    def expire_stale(self) -> list[str]:
        """Re-evaluate placements written but never bound; returns the keys that let go."""
        released: list[str] = []
        for key, f in list(self._pods.items()):
            if f.node is None and f.placement is not None and key not in self._reserved:
                before = bool(self._tenancy.get(key))
                self._apply(key)
                if before and not self._tenancy.get(key):
                    released.append(key)
        return released

    # ---- namespaces ----------------------------------------------------------------------

    def upsert_namespace(self, namespace: Mapping[str, Any]) -> None:
        changed = self.tenancies.upsert(namespace)
        if changed is not None:
            self._regrant({changed})

    def delete_namespace(self, namespace: Mapping[str, Any]) -> None:
        meta = namespace.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if isinstance(name, str) and self.tenancies.delete(name):
            self._regrant({name})

    def replace_namespaces(self, namespaces: Iterable[Mapping[str, Any]]) -> None:
        self._regrant(self.tenancies.replace(namespaces, take=self.quarantine.take))

    def _regrant(self, names: set[str]) -> None:
        """Namespace labels changed: its pods' tenancy and rule grants follow."""
        for key, f in list(self._pods.items()):
            namespace = key.partition("/")[0]
            if namespace not in names:
                continue
            rules = self._rules.by_pod.get(key)
            if rules is not None:
                self._set_rules(
                    key, replace(rules, granted=self.tenancies.neighbour_rules(namespace))
                )
            if f.demand is not None:
                self._pods[key] = replace(f, demand=self.with_tenancy(f.demand, namespace))
            self._apply(key)

    # ---- GpuShares -----------------------------------------------------------------------

    def upsert_share(self, share: Mapping[str, Any]) -> ShareSummary | None:
        """Take a watched GpuShare in; returns it as kept (None for an object with no name)."""
        return self._shares.upsert(share)

    def delete_share(self, share: Mapping[str, Any]) -> None:
        self._shares.delete(share)

    def replace_shares(self, shares: Iterable[Mapping[str, Any]]) -> None:
        """A full list: shares missing from it are gone."""
        self._shares.replace(shares, take=self.quarantine.take)
