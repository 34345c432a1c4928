"""The `ragtune` command's entry point: a quiet start (ragtune/quiet.py) before anything
imports jax, then the Typer app. Importing ragtune.cli.app (as tests do) changes nothing."""

import os


def main():
  from ragtune import stop

  # Ctrl-C or SIGTERM during the imports (seconds, for jax): one line and exit 130 or 143, not a
  # traceback from inside them; each command then installs its own handlers (app._Command).
  stop.exit_at_once()
  from ragtune.quiet import quiet_start

  quiet_start()
  import kernels
  from ragtune.cli.app import app

  # Before jax starts, here and in every worker: an interpreted Mosaic GPU kernel can deadlock
  # XLA:CPU's intra-op pool on a small host (kernels.registry.interpreter_env).
  os.environ.update(kernels.registry.interpreter_env())
  app(prog_name="ragtune")
