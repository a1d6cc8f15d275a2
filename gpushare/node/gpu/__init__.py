"""GPU access behind one small interface: a real NVML backend and a simulated one."""
