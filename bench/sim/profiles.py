"""Deterministic per-pod pipe profiles for the openb trace, which has none.

The trace says what a pod asked for (CPU, memory, GPU share, QoS), not how it uses the GPU. To
weigh packings by predicted interference the simulator gives every pod a solo profile:

1. Archetype: one of the five jobs whose solo GPM profiles the GPU benchmark measured on an H200
   (bench/gpu, ``bench/results/gpu-packing.md``): ResNet-18, ResNet-50, a transformer, an LSTM
   and an FP64 GEMM -- the same profiles the shipped interference model was fit on. The draw is
   ``crc32(pod name) mod 5``, so a pod (and every sampled copy of it) always gets the same one.
   Each archetype carries its measured SM utilization (the share of SMs it keeps busy), which
   the interference model's time-sharing features rest on.
2. Intensity: latency-sensitive pods (``qos == LS``, mostly inference in the trace) are assumed
   to run at half their archetype's load; a pod asking for a share p of a GPU is assumed lighter
   than a whole-GPU job, scaled by ``0.5 + 0.5 p / 100``; and a per-pod jitter in [0.8, 1.2]
   (crc32 again). Loads are capped at 1.
"""

import zlib

from bench.sim.trace import PodSpec
from gpushare.api.profile import PLACEMENT_COUNTERS
from gpushare.packing.model import PipeProfile
from gpushare.packing.stored_profile import counters_pipe_profile

ARCHETYPES: dict[str, tuple[float, float, float, float, float, float, float]] = {
    # name: (fp16, fp32, fp64, tensor, sm_occupancy, dram_bandwidth, sm_utilization),
    # H200 GPM, alone, 100% threads (bench/gpu/data/colocations.json)
    "resnet18": (0.0, 0.0152, 0.0, 0.0493, 0.1215, 0.071, 0.3847),
    "resnet50": (0.0, 0.0321, 0.0, 0.1255, 0.4756, 0.4162, 0.8443),
    "transformer": (0.0, 0.024, 0.0, 0.3113, 0.4183, 0.4119, 0.8663),
    "lstm": (0.0, 0.0034, 0.0, 0.1028, 0.0554, 0.0989, 0.413),
    "fp64-gemm": (0.0, 0.0, 0.0002, 0.9691, 0.1221, 0.1038, 0.9837),
}
_NAMES = tuple(ARCHETYPES)
_COUNTERS = (*PLACEMENT_COUNTERS, "sm_utilization")
"""What each archetype's numbers are, in order."""
LATENCY_SCALE = 0.5


def base_name(name: str) -> str:
    """The trace pod a sampled copy came from (copies are named ``<name>~<n>``)."""
    return name.split("~", 1)[0]


def archetype(pod: PodSpec) -> str:
    return _NAMES[zlib.crc32(base_name(pod.name).encode()) % len(_NAMES)]


def profile_of(pod: PodSpec) -> PipeProfile:
    values = ARCHETYPES[archetype(pod)]
    h = zlib.crc32(base_name(pod.name).encode() + b"/jitter")
    jitter = 0.8 + 0.4 * (h % 1001) / 1000
    share = min(pod.percent, 100) / 100 if pod.num_gpu else 1.0
    scale = (0.5 + 0.5 * share) * jitter * (LATENCY_SCALE if pod.qos == "LS" else 1.0)
    scaled = (min(1.0, v * scale) for v in values)
    return counters_pipe_profile(dict(zip(_COUNTERS, scaled, strict=True)))
