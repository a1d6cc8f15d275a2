"""Device plugin benchmarks: Allocate latency (simulated GPUs, real API server) and the MPS
checks on a real GPU (tests/gpu/test_mps_gpu.py). Both write bench/results/deviceplugin.json."""
