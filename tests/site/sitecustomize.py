"""The test runs' XLA:CPU compiles skip LLVM's optimizations.

On a CPU host much of the suite's time goes into compiling: every kernel runs in an
interpreter that XLA:CPU compiles afresh for each shape and then runs once, on a few KiB.
LLVM's passes cost more there than they save (35-40% of an interpreted case's CPU time), so
the tests compile XLA:CPU programs as jax's own `jax_disable_most_optimizations` does, for the
CPU alone. The deviceless GPU and TPU compiles keep XLA's defaults: they are the proofs of what
a device builds. The HLO and its buffers are the same at either level; a value can differ in
its last bit (LLVM's choice of instructions), well within every tolerance the tests hold.

tests/conftest.py applies it in the pytest process and puts this folder on PYTHONPATH, where
Python imports it at the start of every process the tests start (sweep workers, the CLI).
It must not import jax: a worker pins its device before jax starts. It patches
jax._src.compiler.get_compile_options, private to jax; where that is missing, or its
signature moved, nothing changes but the time.
"""

import importlib.abc
import importlib.util
import os
import sys

_MODULE = "jax._src.compiler"


def _patch(compiler) -> None:
  real = getattr(compiler, "get_compile_options", None)
  if real is None or getattr(real, "cpu_unoptimized", False):
    return

  def get_compile_options(*args, **kwargs):
    options = real(*args, **kwargs)
    if getattr(kwargs.get("backend"), "platform", None) == "cpu":
      debug = options.executable_build_options.debug_options
      debug.xla_backend_optimization_level = 0
      debug.xla_llvm_disable_expensive_passes = True
    return options

  get_compile_options.cpu_unoptimized = True
  compiler.get_compile_options = get_compile_options


class _AfterImport(importlib.abc.MetaPathFinder):
  """Patches the module as soon as it is imported, whoever imports it."""

  def find_spec(self, name, path, target=None):
    if name != _MODULE:
      return None
    sys.meta_path.remove(self)
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
      return spec
    run = spec.loader.exec_module

    def exec_module(module):
      run(module)
      _patch(module)

    spec.loader.exec_module = exec_module
    return spec


def install() -> None:
  if _MODULE in sys.modules:
    _patch(sys.modules[_MODULE])
  elif not any(type(f).__name__ == _AfterImport.__name__ for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterImport())


def _run_the_one_hidden() -> None:
  """The sitecustomize this one hides on sys.path (a distribution's, a user's) still runs."""
  here = os.path.dirname(os.path.abspath(__file__))
  for entry in sys.path:
    path = os.path.join(entry or os.getcwd(), "sitecustomize.py")
    if os.path.abspath(os.path.dirname(path)) != here and os.path.isfile(path):
      spec = importlib.util.spec_from_file_location("_sitecustomize_hidden", path)
      spec.loader.exec_module(importlib.util.module_from_spec(spec))
      return


install()
if __name__ == "sitecustomize":
  _run_the_one_hidden()
