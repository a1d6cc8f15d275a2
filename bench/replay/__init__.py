"""The openb placement experiment replayed through a real control plane (see run.py)."""
