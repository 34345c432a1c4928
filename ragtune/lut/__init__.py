"""From records to the kernels' lookup table: export it, re-check it on fresh inputs, and bench what it bought."""
