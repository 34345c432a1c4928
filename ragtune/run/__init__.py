"""How a sweep runs: its options, its plan, this host's devices, the worker pool, and the
killable child processes that the pool, verify and the device probe start."""
