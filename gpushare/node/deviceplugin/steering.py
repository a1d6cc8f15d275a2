"""Which slices GetPreferredAllocation offers: those of the GPU(s) the scheduler chose for the
pod whose Allocate comes next, so that the kubelet's later Allocate names slices of the GPU its
pod's placement says (the kubelet passes only device IDs). A pod a restarted kubelet forgot gets
the very slices it had (``steer``); with no pod waiting, a best fit.
"""

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet

from gpushare.api.names import OPPORTUNISTIC_SLICES_PER_GPU
from gpushare.api.pod import PodInfo
from gpushare.node.core.pods import annotated_gpus
from gpushare.node.deviceplugin.devices import capacity_of, ids_by_gpu
from gpushare.node.deviceplugin.matching import waiting_pods


def steer(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    pods: Iterable[PodInfo],
    *,
    skip: AbstractSet[str] = frozenset(),
    again: AbstractSet[str] = frozenset(),
    previous: Mapping[str, tuple[str, ...]] | None = None,
) -> tuple[list[str], str | None]:
    """GetPreferredAllocation: ``size`` slice IDs from ``available`` (``must_include`` first),
    taken from the GPU(s) the scheduler chose for the oldest waiting pod that fits there, else
    a best fit. Returns the IDs and the pod steered for (None for a best fit). A pod forgotten
    by a restarted kubelet (``again``) gets the very slices its earlier answer covered
    (``previous``: uid -> slice IDs) when they are all still available.

    Pods that asked for exactly ``size`` slices in one container are tried first: with pods of
    several sizes waiting on one node, the kubelet's request for 30 slices is for a 30-slice
    pod, and steering it to an older 50-slice pod's GPU would make Allocate derive a placement.
    """
    free = ids_by_gpu(available)
    capacity = capacity_of(available)  # slices per GPU: 100, or 300 opportunistic ones
    must = list(dict.fromkeys(must_include))
    must_gpus = set(ids_by_gpu(must))
    target: list[str] | None = None
    steered: str | None = None
    opportunistic = capacity == OPPORTUNISTIC_SLICES_PER_GPU
    waiting = waiting_pods(pods, skip=skip, again=again, opportunistic=opportunistic)
    sized = [c for c in waiting if size in c.pod.requested_slices]
    offered = set(available)
    for cand in sized + [c for c in waiting if c not in sized]:
        if cand.placement is None:
            # Malformed: still steer to the GPU it names (when it names one of ours), so the
            # slices come from where its annotation points; Allocate then refuses it.
            gpus = sorted(annotated_gpus(cand.pod) & set(free))
            if len(gpus) == 1 and size < capacity and len(free[gpus[0]]) >= size:
                target, steered = gpus, cand.pod.key
                break
            continue
        same = (previous or {}).get(cand.pod.uid, ()) if cand.pod.uid in again else ()
        if len(same) == size and offered.issuperset(same) and set(must) <= set(same):
            return list(same), cand.pod.key
        gpus = list(cand.placement.gpu_uuids)
        if must_gpus - set(gpus):
            continue
        per_gpu = size if len(gpus) == 1 else capacity
        if len(gpus) > 1 and len(gpus) * per_gpu != size:
            continue
        if all(len(free.get(g, [])) >= per_gpu for g in gpus):
            target, steered = gpus, cand.pod.key
            break
    if target is None:
        target = _best_fit(free, size, capacity)
    return _fill(must, target, free, available, size), steered


def _fill(
    must: list[str],
    target: list[str],
    free: Mapping[str, list[str]],
    available: Sequence[str],
    size: int,
) -> list[str]:
    """``size`` slice IDs: ``must`` first, then free slices of the ``target`` GPUs, topped
    up from anything available when those cannot fill the request."""
    chosen = list(must)
    for uuid in target:
        for ident in free.get(uuid, []):
            if len(chosen) >= size:
                break
            if ident not in chosen:
                chosen.append(ident)
    # Top up from anything available if the target could not fill the request.
    for ident in available:
        if len(chosen) >= size:
            break
        if ident not in chosen:
            chosen.append(ident)
    return chosen[:size]


def _best_fit(free: Mapping[str, list[str]], size: int, capacity: int) -> list[str]:
    """GPUs to take ``size`` slices from when no pod tells us: whole GPUs for multiples of
    ``capacity`` (a GPU's slices), else the GPU with the fewest free slices that still fits
    (keeps big holes for big pods)."""
    if size >= capacity:
        full = sorted(u for u, s in free.items() if len(s) == capacity)
        return full[: size // capacity] + sorted(free, key=lambda u: -len(free[u]))
    fits = [u for u, s in free.items() if len(s) >= size]
    if fits:
        return [min(fits, key=lambda u: (len(free[u]), u))]
    return sorted(free, key=lambda u: -len(free[u]))
