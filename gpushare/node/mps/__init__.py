"""MPS control daemons, one per GPU, started before the GPU is advertised and adopted on restart."""
