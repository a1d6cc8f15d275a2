"""Pure placement policy: fit, score, thread-percentage assignment, fragmentation, interference.

No Kubernetes, NVML, gRPC or I/O here (import-linter enforces it): the extender, the operator,
the simulator and the benchmarks all run exactly this code.
"""
