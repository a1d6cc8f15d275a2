"""Real-GPU benchmark of job mixes: gpushare vs exclusive FIFO, time-slicing and plain MPS.

Entry point: ``python -m bench.gpu.run --out DIR [--trace FILE ...]``; every gpushare decision
in it is the product's (``decide``). Only ``workloads`` and
``worker`` import torch; everything else is plain Python so the harness logic is unit-tested
on machines without a GPU.
"""
