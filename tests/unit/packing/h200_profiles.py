"""Solo profiles the GPU benchmark measured on an H200 (runs 33-35, bench/gpu/data): the
notebook runs 8 ResNet-18 steps, then sleeps 0.5 s, and NVML saw a kernel running 7% of its
time; the batch kinds keep one running 51-98% of theirs. Shared by the tests that replay
decisions those runs made."""

from gpushare.packing.model import PipeProfile

NOTEBOOK_COUNTERS = {
    "fp32": 0.0009, "tensor": 0.0029, "sm_occupancy": 0.0072, "dram_bandwidth": 0.0043,
    "sm_utilization": 0.0227, "utilization": 0.071,
}  # fmt: skip
"""The notebook's counters by their names of record (as a stored profile keeps them)."""
NOTEBOOK = PipeProfile(**NOTEBOOK_COUNTERS)
RESNET18 = PipeProfile(
    fp32=0.0103, tensor=0.0332, sm_occupancy=0.082, dram_bandwidth=0.0484,
    sm_utilization=0.2593, utilization=0.5114,
)  # fmt: skip
RESNET50 = PipeProfile(
    fp32=0.0319, tensor=0.1241, sm_occupancy=0.4724, dram_bandwidth=0.4135,
    sm_utilization=0.839, utilization=0.9786,
)  # fmt: skip
GPT2 = PipeProfile(
    fp16=0.0004, fp32=0.0192, tensor=0.105, sm_occupancy=0.4436, dram_bandwidth=0.4126,
    sm_utilization=0.7303, utilization=0.9186,
)  # fmt: skip
LSTM = PipeProfile(
    fp32=0.0027, tensor=0.0804, sm_occupancy=0.0423, dram_bandwidth=0.0726,
    sm_utilization=0.3198, utilization=0.7171,
)  # fmt: skip
TRANSFORMER = PipeProfile(
    fp32=0.0238, tensor=0.3091, sm_occupancy=0.4122, dram_bandwidth=0.4057,
    sm_utilization=0.8558, utilization=0.9757,
)  # fmt: skip
