"""What a job asks for when its trace row sets no ``fraction``: the user's part, not gpushare's.

In a cluster a user writes ``gpushare.io/gpu-fraction`` on the pod; the benchmark plays that
user with one documented rule applied to the job's solo profile from gpushare's profiler
(docs/benchmarks-gpu.md, "Requests"). Every placement, cap, priority and admission decision is
then gpushare's own (``decide.ProductDecider``). A trace that sets ``fraction`` (and ``limit``)
per row overrides this rule, as a user's annotations would.
"""

import math
from collections.abc import Mapping

from gpushare.api.names import CLASS_LATENCY
from gpushare.packing.threads import HEADROOM, SATURATING

LATENCY_FRACTION = 0.25
"""Share a latency-class job asks for: room for bursts (the service measured here keeps 2% of
the SMs busy); it runs uncapped at MPS priority 0, so the share is admission bookkeeping."""
SATURATING_KEYS = ("sm_utilization", "fp16", "fp32", "fp64", "tensor")
SIZING_KEYS = ("sm_occupancy", "fp16", "fp32", "fp64", "tensor", "dram_bandwidth")


def request_fraction(values: Mapping[str, float] | None, *, gpu_class: str) -> float:
    """The share a job asks for, sized from its solo profile as a user reading gpushare's
    profiler would. A job that alone keeps the SMs or a pipe busier than
    ``threads.SATURATING`` asks for the whole GPU (packing it only adds interference); any
    other asks for its compute demand (SM occupancy, pipes, DRAM -- what its neighbours feel)
    plus gpushare's headroom, rounded up to 5%: its limit (the thread cap) is the whole GPU
    unless it sets one. Latency-class jobs ask for LATENCY_FRACTION; without a profile a job
    asks for the whole GPU."""
    if gpu_class == CLASS_LATENCY:
        return LATENCY_FRACTION
    if not values:
        return 1.0
    busiest = max(float(values.get(k, 0.0) or 0.0) for k in SATURATING_KEYS)
    if busiest >= SATURATING:
        return 1.0
    demand = max(float(values.get(k, 0.0) or 0.0) for k in SIZING_KEYS)
    return min(1.0, max(0.05, math.ceil(demand * HEADROOM * 20 - 1e-9) / 20))
