"""ragtune: tune grouped-matmul (ragged_dot) kernels per device and export lookup tables.

Data flow: shapes (YAML) -> search_space -> measure -> store (records.jsonl) ->
export (LUT JSON) -> kernels (runtime). verify re-checks a LUT on fresh inputs.
"""


def __getattr__(name: str) -> str:
  if name == "__version__":  # one source: ragtune.provenance.ragtune_version
    from ragtune import provenance

    return provenance.ragtune_version()
  raise AttributeError(f"module 'ragtune' has no attribute {name!r}")
