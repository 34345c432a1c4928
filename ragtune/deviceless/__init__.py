"""XLA's real GPU and TPU compilers run on a CPU host for a named device, and what the compiled kernels are made of."""
