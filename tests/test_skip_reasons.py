"""The deviceless compile tests skip with their reason where their extra is missing, rather than
fail to be collected: conftest's checks on an install with no jax_plugins package at all (the
test extra alone), simulated in this process."""

import importlib.util
import sys

import pytest
from conftest import gpu_compile_missing, module_found


@pytest.fixture
def no_jax_plugins(monkeypatch):
  """jax_plugins as pip leaves it without the gpu-compile extra: not importable."""
  for name in [n for n in sys.modules if n.startswith("jax_plugins.")]:
    monkeypatch.delitem(sys.modules, name)
  monkeypatch.setitem(sys.modules, "jax_plugins", None)  # import jax_plugins raises ModuleNotFoundError


def test_a_module_whose_package_is_missing_is_not_found(no_jax_plugins):
  with pytest.raises(ModuleNotFoundError):  # what importlib.util.find_spec itself does
    importlib.util.find_spec("jax_plugins.xla_cuda12")
  assert not module_found("jax_plugins.xla_cuda12")
  assert not module_found("jax_plugins")


def test_module_found_finds_what_is_there_and_not_what_is_not():
  assert module_found("json") and module_found("json.decoder")
  assert not module_found("json.no_such_module") and not module_found("no_such_package_here")


def test_no_cuda_plugin_is_a_skip_reason(no_jax_plugins):
  assert gpu_compile_missing() == "no CUDA plugin (pip install -e '.[gpu-compile]')"
