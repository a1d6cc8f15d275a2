"""Deterministic per-pod pipe profiles for the openb trace, which has none.

The trace says what a pod asked for (CPU, memory, GPU share, QoS), not how it uses the GPU. To
weigh packings by predicted interference the simulator gives every pod a solo profile:

1. Archetype: latency-sensitive pods (``qos == LS``) draw an inference archetype, the rest a
   training/HPC archetype. The draw is ``crc32(pod name) mod N``, so a pod (and every sampled
   copy of it) always gets the same one.
2. Archetype numbers come from published measurements: training jobs from the cautiously
   aggressive space-sharing paper's Table 1 (pipe utilizations; NVML utilization read as SM
   occupancy), the dense GEMMs from DESIGN.md's H200 GPM readings, inference jobs from the KACE
   slides' SM-busy / memory-busy table. Pipe splits the sources do not give are assumptions.
3. Intensity: a pod that asks for a share p of a GPU is assumed lighter than a whole-GPU job:
   every load is multiplied by ``0.5 + 0.5 * p / 100`` and by a per-pod jitter in [0.8, 1.2]
   (again from crc32 of the name), capped at 1.
"""

import zlib

from bench.sim.trace import PodSpec
from gpushare.packing.model import PipeProfile

# name: (fp16, fp32, fp64, tensor, sm_occupancy, dram_bandwidth)
TRAINING: dict[str, tuple[float, float, float, float, float, float]] = {
    "resnet18": (0.0, 0.40, 0.0, 0.0, 0.77, 0.35),
    "resnet18-amp": (0.0, 0.32, 0.0, 0.30, 0.48, 0.30),
    "resnet50": (0.0, 0.52, 0.0, 0.0, 0.96, 0.45),
    "lstm": (0.0, 0.33, 0.0, 0.0, 0.74, 0.40),
    "lstm-amp": (0.0, 0.11, 0.0, 0.11, 0.63, 0.35),
    "recoder": (0.0, 0.25, 0.0, 0.0, 0.12, 0.25),
    "dgemm": (0.0, 0.0, 0.60, 0.0, 0.85, 0.20),
    "bf16-gemm": (0.0, 0.0, 0.0, 0.78, 0.95, 0.25),
}
INFERENCE: dict[str, tuple[float, float, float, float, float, float]] = {
    "bert-inference": (0.0, 0.10, 0.0, 0.35, 0.95, 0.39),
    "vit-inference": (0.0, 0.05, 0.0, 0.12, 0.29, 0.05),
    "whisper-inference": (0.0, 0.05, 0.0, 0.15, 0.44, 0.20),
    "wav2vec2-inference": (0.0, 0.08, 0.0, 0.0, 0.19, 0.07),
    "resnet50-inference": (0.05, 0.05, 0.0, 0.15, 0.30, 0.15),
}
_TRAINING_NAMES = tuple(TRAINING)
_INFERENCE_NAMES = tuple(INFERENCE)


def archetype(pod: PodSpec) -> str:
    h = zlib.crc32(base_name(pod.name).encode())
    if pod.qos == "LS":
        return _INFERENCE_NAMES[h % len(_INFERENCE_NAMES)]
    return _TRAINING_NAMES[h % len(_TRAINING_NAMES)]


def base_name(name: str) -> str:
    """The trace pod a sampled copy came from (copies are named ``<name>~<n>``)."""
    return name.split("~", 1)[0]


def profile_of(pod: PodSpec) -> PipeProfile:
    kind = archetype(pod)
    values = TRAINING.get(kind) or INFERENCE[kind]
    h = zlib.crc32(base_name(pod.name).encode() + b"/jitter")
    jitter = 0.8 + 0.4 * (h % 1001) / 1000
    share = min(pod.percent, 100) / 100 if pod.num_gpu else 1.0
    scale = (0.5 + 0.5 * share) * jitter
    fp16, fp32, fp64, tensor, occ, dram = (min(1.0, v * scale) for v in values)
    return PipeProfile(
        fp16=fp16, fp32=fp32, fp64=fp64, tensor=tensor, sm_occupancy=occ, dram_bandwidth=dram
    )
