"""What a guaranteed share is worth beside opportunistic neighbours: the rate it alone gives.

A pod's request is a guarantee (docs/packing.md, "The sharing contract"): a batch pod holding
``p``% of a GPU must keep at least the rate it would have alone at a ``p``% thread cap, however
many opportunistic pods run beside it. The class bound (2.0x the pod alone on the whole GPU)
does not say that: on the heavy trace an opportunistic transformer beside a guaranteed 65%
ResNet-50 was predicted to slow it to 1.93x (under the bound) for 0.06 jobs/s more work, and
measured 2.07x, so both finished later than one after the other (mean JCT 1.05-1.06x exclusive
FIFO's on the H200, runs 41-45). :func:`floor_reason` refuses an opportunistic pod (placed or
resumed) that would take a guaranteed tenant below that floor: with it, heavy's mean JCT was
1.00-1.01x every way, and no other trace lost (docs/benchmarks-gpu.md, "Run 52").
"""

from collections.abc import Sequence

from gpushare.api.names import CLASS_BATCH, SLICES_PER_GPU
from gpushare.packing.interference import InterferenceModel
from gpushare.packing.model import Tenant

KEPT = 0.9
"""Share of its floor a guaranteed tenant keeps at least beside an opportunistic newcomer: the
floor is a prediction, and a light job loses a few percent to any neighbour whatever its
share (memory traffic, not SMs); within a tenth of it, three light jobs still share."""


def floor_rate(tenant: Tenant, model: InterferenceModel) -> float:
    """``tenant``'s rate (over its rate alone on the whole GPU) alone at a thread cap of its
    request: the model's cap cost where its SM utilization was measured (the cost was fit on
    it), else the request's share of the GPU (a job that keeps every SM busy)."""
    share = max(1, min(tenant.percent, SLICES_PER_GPU))
    profile = tenant.profile
    if profile is None or profile.sm_utilization is None:
        return share / SLICES_PER_GPU
    return 1.0 / model.cap_slowdown(profile, share)


def floor_reason(
    tenants: Sequence[Tenant],
    before: Sequence[float],
    after: Sequence[float],
    model: InterferenceModel,
) -> str | None:
    """Why an opportunistic newcomer would take a guaranteed batch tenant below its floor, or
    None. ``before``/``after``: each of ``tenants``' predicted rates without and with the
    newcomer (over its rate alone on the whole GPU, in ``tenants``' order). The floor is the
    lower of :func:`floor_rate` and its rate without the newcomer (its guaranteed neighbours'
    doing), and the newcomer may take it to :data:`KEPT` of that, no lower."""
    for tenant, without, with_it in zip(tenants, before, after, strict=True):
        if tenant.opportunistic or tenant.gpu_class != CLASS_BATCH:
            continue
        floor = KEPT * min(floor_rate(tenant, model), without)
        if with_it < floor:
            return (
                f"would slow guaranteed pod {tenant.key} to {with_it:.2f} of its speed alone, "
                f"below {floor:.2f} (its {tenant.percent}% share alone, less a tenth)"
            )
    return None
