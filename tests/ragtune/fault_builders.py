"""Fault-injecting op builders for sweep tests (`--builder fault_builders:build`).

Workers import this module by name, so tests put tests/ragtune/ on PYTHONPATH. Which candidate
misbehaves is fixed by its position in the problem's candidate list: [1] hangs, [2] kills
its own process with SIGSEGV, [3] returns wrong values, [4] puts a NaN in its output,
[5] fails like a CUDA illegal address (which can poison a GPU context); the rest are the real op.
"""

import os
import signal
import time

import jax

from ragtune.candidates import search_space
from ragtune.device import measure


def _role(p, config):
  cands = search_space.candidates(p)
  roles = {1: "hang", 2: "segv", 3: "wrong", 4: "nan", 5: "poison"}
  for i, role in roles.items():
    if i < len(cands) and cands[i] == config:
      return role
  return None


def build(p, backend, config, interpret):
  fn = measure.build_op(p, backend, config, interpret)
  role = _role(p, config)
  if role == "hang":

    def hang(*a):
      while True:  # never returns; only killing the process stops it
        time.sleep(1)

    return hang
  if role == "segv":

    def segv(*a):
      os.kill(os.getpid(), signal.SIGSEGV)

    return segv
  if role == "wrong":
    return lambda *a: fn(*a) * 1.05
  if role == "poison":

    def poison(*a):
      raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered")

    return jax.jit(lambda *a: jax.pure_callback(poison, jax.ShapeDtypeStruct((p.m, p.n), p.dtype), *a))
  if role == "nan":
    return lambda *a: fn(*a).at[0, 0].set(float("nan"))
  return fn


def hold(p, backend, config, interpret):
  """While $FAULT_HOLD names a file, candidate [1] writes it and then hangs: a test that sees the
  file knows that a candidate is in flight. Every other candidate, and all without the variable,
  are the real op."""
  path = os.environ.get("FAULT_HOLD")
  if path and _role(p, config) == "hang":

    def held(*a):
      with open(path, "w"):
        pass
      while True:
        time.sleep(1)

    return held
  return measure.build_op(p, backend, config, interpret)


def fail_build(p, backend, config, interpret):
  """Every candidate fails (as compile_error), so its problem ends with no correct candidate."""
  raise RuntimeError("injected: this candidate does not build")


def compile_faults(target, p, config):
  """A stand-in for ragtune.candidates.prune's compile, for compile_many's fault handling: config is a
  word saying what to do."""
  import os
  import time

  if config == "crash":
    os._exit(3)
  if config == "hang":
    time.sleep(120)
  if config == "setup":
    return {"outcome": "compile_error", "error": "no ptxas", "compile_s": 0.0, "kernels": [], "setup_error": True}
  return {"outcome": "ok", "error": "", "compile_s": 0.0, "kernels": []}


def missing_module(p, backend, config, interpret):
  """Every candidate fails as a kernel whose module needs a package that is not installed."""
  raise ModuleNotFoundError("No module named 'absl'", name="absl")
