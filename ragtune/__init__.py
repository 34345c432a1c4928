"""ragtune: tune grouped-matmul (ragged_dot) kernels per device and export lookup tables.

The packages are the pipeline's stages:
problems (shape sets -> Problems) -> candidates (search space, strategy, pruning) ->
run (the sweep: plan, workers, resume) -> device (measure one problem on the device) ->
records (records.jsonl, the best per problem, tables) -> lut (export, verify, bench) ->
kernels (runtime). deviceless compiles for a named GPU or TPU on a CPU host; cli is the
command line over all of them.

From a model's own step: `ragtune.capture(step, *args)` finds its grouped matmuls with the
group sizes its router produced (a ShapeSet; `.write(path)` makes it a shape file), and
`ragtune.tune(step, *args, budget=8)` captures, sweeps, verifies and exports the LUT.
"""

import os as _os

# A process the `ragtune` command started (ragtune/quiet.py marks them): the same quiet
# jax start-up as the command's, before anything here imports jax.
if _os.environ.get("RAGTUNE_QUIET_START") == "1":
  from ragtune.quiet import quiet_start as _quiet_start

  _quiet_start()


def __getattr__(name: str):
  """ragtune.capture (ragtune/problems/capture.py), ragtune.tune (ragtune/lut/tune.py) and
  __version__, imported when first asked for: `import ragtune` stays light for the workers."""
  if name == "__version__":  # one source: ragtune.provenance.ragtune_version
    from ragtune import provenance

    return provenance.ragtune_version()
  if name == "capture":
    from ragtune.problems.capture import capture

    return capture
  if name == "tune":
    from ragtune.lut.tune import tune

    return tune
  raise AttributeError(f"module 'ragtune' has no attribute {name!r}")
