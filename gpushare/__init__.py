"""gpushare: pack several Kubernetes pods onto one NVIDIA GPU with MPS."""

__version__ = "0.1.0"
