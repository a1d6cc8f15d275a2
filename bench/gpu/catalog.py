"""The job catalogue: what each benchmark job is, in plain data (torch lives in workloads.py).

Every job does a fixed amount of work (iterations, or requests for the inference service) so
its completion time means the same thing under every sharing scheme. Iteration counts are
derived once per run from the job's measured solo rate and a target solo duration, so one
harness fits both an H100 and an H200.
"""

from dataclasses import dataclass

from gpushare.api.names import CLASS_BATCH, CLASS_LATENCY


@dataclass(frozen=True)
class JobKind:
    """One kind of job the workers know how to build."""

    name: str
    description: str
    gpu_class: str = CLASS_BATCH
    poisson: bool = False
    """True for the inference service: requests arrive as a Poisson process."""
    request_rate_hz: float = 0.0
    """Mean request arrival rate of the inference service."""
    unseen: bool = False
    """Never in any fit of the shipped interference model: its packs test how the model
    generalises to jobs it has not seen (docs/benchmarks-gpu.md, "Model generalisation")."""
    memory_mib: int = 0
    """Declared GPU memory of one of its processes, in MiB, CUDA context included: what NVML
    listed for it after running alone in runs 24 and 25 (H100 and H200 alike); ``bgemm`` and
    ``notebook``, in none of those traces, are their tensors plus the 758 MiB a ResNet-18
    process held beyond its allocator. A run measures every kind it runs alone (phase A) and
    uses its own figure; this one stands in where it has none (a phase A stored before)."""
    burst: int = 0
    """For a kind that sits mostly idle (a notebook): training steps per burst of GPU work,
    each burst followed by ``idle_s`` of sleep. 0: steps back to back."""
    idle_s: float = 0.0


KINDS: dict[str, JobKind] = {
    k.name: k
    for k in (
        JobKind(
            "resnet18",
            "ResNet-18 training, CIFAR-size 32x32 images, batch 32, fp32/TF32 (small batch)",
            memory_mib=1160,
        ),
        JobKind(
            "resnet50",
            "ResNet-50 training, 224x224 images, batch 128, bf16 autocast, channels-last",
            memory_mib=7016,
        ),
        JobKind(
            "transformer",
            "Transformer encoder training (6 layers, d=1024, seq 512, batch 32), bf16 autocast",
            memory_mib=5148,
        ),
        JobKind(
            "resnet50_xl",
            "ResNet-50 training, batch 256 (otherwise as resnet50): keeps every SM busy",
            memory_mib=12760,
        ),
        JobKind(
            "transformer_xl",
            "Transformer encoder training, batch 64 (otherwise as transformer): keeps SMs busy",
            memory_mib=8280,
        ),
        JobKind(
            "lstm",
            "2-layer LSTM training (hidden 1024, seq 64, batch 32), fp32 cuDNN",
            memory_mib=1338,
        ),
        JobKind("dgemm", "FP64 GEMM loop, 8192x8192 matrices (FP64 tensor cores)", memory_mib=2154),
        JobKind(
            "gpt2",
            "GPT-2-style decoder training (transformers GPT2Config: 12 layers, d=768, seq 512, "
            "batch 8), bf16 autocast, random weights",
            unseen=True,
            memory_mib=7594,
        ),
        JobKind(
            "bert",
            "BERT-base inference, offline batches (transformers BertConfig defaults, seq 128, "
            "batch 32), bf16, random weights",
            unseen=True,
            memory_mib=1296,
        ),
        JobKind(
            "vit",
            "ViT-B/16 training (torchvision vit_b_16, weights=None, 224x224, batch 32), bf16",
            unseen=True,
            memory_mib=4114,
        ),
        JobKind(
            "bgemm",
            "bf16 GEMM loop, 8192x8192 matrices (the GEMM of an LLM layer with d=8192 over 8k "
            "tokens; tensor cores): the second pipe-saturating kind, after dgemm",
            unseen=True,
            memory_mib=1536,
        ),
        JobKind(
            "notebook",
            "an interactive notebook: bursts of 8 ResNet-18 training steps (as resnet18), each "
            "followed by 0.5 s idle, so the GPU is busy about a tenth of the time",
            memory_mib=1160,
            burst=8,
            idle_s=0.5,
        ),
        JobKind(
            "infer",
            "ResNet-50 inference service, batch 8, bf16, Poisson arrivals, per-request latency",
            gpu_class=CLASS_LATENCY,
            poisson=True,
            request_rate_hz=40.0,
            memory_mib=890,
        ),
    )
}

# Kinds measured in colocation packs. The inference service (Poisson arrivals: its rate is its
# arrival rate) and the heavy trace's XL jobs (they ask for whole GPUs) are profiled alone, as
# is any other kind a trace holds (the notebook: a 1-s pack window sees two of its bursts).
TRAINING_KINDS: tuple[str, ...] = ("resnet18", "resnet50", "transformer", "lstm", "dgemm")
UNSEEN_KINDS: tuple[str, ...] = tuple(k.name for k in KINDS.values() if k.unseen)
SOLO_ONLY_KINDS: tuple[str, ...] = ("infer", "resnet50_xl", "transformer_xl")


def kind(name: str) -> JobKind:
    """Look a kind up, naming the known ones when the name is wrong."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(
            f"job kind {name!r} is unknown; use one of {', '.join(sorted(KINDS))}"
        ) from None
