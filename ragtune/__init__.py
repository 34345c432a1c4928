"""ragtune: tune grouped-matmul (ragged_dot) kernels per device and export lookup tables.

Data flow: shapes (YAML) -> search_space -> measure -> store (records.jsonl) ->
export (LUT JSON) -> kernels (runtime). verify re-checks a LUT on fresh inputs.
"""

__version__ = "0.1.0"
