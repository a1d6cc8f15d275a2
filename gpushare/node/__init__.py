"""The node agent: GPU backend, MPS daemons, device plugin, node publishing and metrics."""
