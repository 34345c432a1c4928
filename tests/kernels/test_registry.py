"""The registry as the one list of backends: adding one is a folder and a line, "auto"
follows each backend's priority, and use_lut scopes a LUT to a block."""

import itertools
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import jax.numpy as jnp
import pytest

import kernels
from kernels import common, registry

ROOT = Path(__file__).resolve().parents[2]
H100, B200 = "NVIDIA H100 80GB HBM3", "NVIDIA B200"

_TOY = '''
import dataclasses

from kernels.backend import Backend
from kernels.xla import ops


@dataclasses.dataclass(frozen=True)
class ToyConfig:
  split: int = 1

  def fits(self, op, dtype, m, k, n, device_kind=None):
    return True

  def to_dict(self):
    return dataclasses.asdict(self)


def forward(lhs, rhs, group_sizes, *, config, out_dtype, transpose_rhs=False, group_offset=None, precision=None,
            interpret=False):
  return ops.gmm(lhs, rhs, group_sizes, out_dtype=out_dtype, transpose_rhs=transpose_rhs,
                 group_offset=group_offset, precision=precision)


def grad_rhs(lhs, dout, group_sizes, *, num_groups, config, out_dtype, transpose_rhs=False, group_offset=None,
             precision=None, interpret=False):
  a, b = (dout, lhs) if transpose_rhs else (lhs, dout)
  return ops.tgmm(a, b, group_sizes, num_groups=num_groups, out_dtype=out_dtype, group_offset=group_offset,
                  precision=precision)


BACKEND = Backend(
    name="toy", forward=forward, grad_rhs=grad_rhs, config_type=ToyConfig, dtypes=("float32",),
    platforms=("toy_platform",), default=lambda *a, **kw: ToyConfig(),
    space=lambda op, dtype, m, k, n, device_kind: [ToyConfig(1), ToyConfig(2)])
'''

_USE = '''
import jax, jax.numpy as jnp, numpy as np
import kernels
from kernels import registry
from ragtune.candidates import search_space
from ragtune.problems import shapes

assert "toy" in registry.NAMES
spec = shapes.ShapeSet.model_validate({"backends": ["toy"], "ops": ["fwd", "drhs"], "dtype": "float32",
                                       "shapes": [{"m": 64, "k": 32, "n": 48, "g": 3}]})
problems = shapes.expand(spec)
assert [len(search_space.candidates(p, device_kind="cpu")) for p in problems] == [2, 2]
x = jax.random.normal(jax.random.key(0), (64, 32)); w = jax.random.normal(jax.random.key(1), (3, 32, 48))
gs = jnp.array([10, 0, 40], jnp.int32)
got = kernels.ragged_dot(x, w, gs, backend="toy")
np.testing.assert_allclose(got, jax.lax.ragged_dot(x, w, gs), rtol=1e-5, atol=1e-5)
lut = kernels.Lut.from_dict({"schema": "ragtune-lut", "schema_version": 2, "device_kind": "cpu", "entries": [
    {"op": "fwd", "backend": "toy", "dtype": "float32", "m": 64, "k": 32, "n": 48, "g": 3, "config": {"split": 2}}]})
with kernels.use_lut(lut):
  assert kernels.explain((64, 32), (3, 32, 48), jnp.float32, backend="toy")["fwd"].config.split == 2
print("toy backend ok")
'''


def test_a_new_backend_is_one_folder_and_one_registry_line(tmp_path):
  """A copy of the package with kernels/toy/ and one line in registry.py: ragged_dot,
  explain, the LUT, the shape-file schema and the search space all take it."""
  shutil.copytree(ROOT / "kernels", tmp_path / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
  shutil.copytree(ROOT / "ragtune", tmp_path / "ragtune", ignore=shutil.ignore_patterns("__pycache__"))
  (tmp_path / "kernels" / "toy").mkdir()
  (tmp_path / "kernels" / "toy" / "__init__.py").write_text(_TOY)
  reg = tmp_path / "kernels" / "registry.py"
  text = reg.read_text()
  line = next(l for l in text.splitlines(keepends=True) if l.strip() == '"kernels.xla",')
  reg.write_text(text.replace(line, line + line.replace("xla", "toy")))
  r = subprocess.run(
    [sys.executable, "-c", _USE],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=300,
    env={"PYTHONPATH": str(tmp_path), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
  )
  assert r.returncode == 0 and "toy backend ok" in r.stdout, r.stderr[-3000:]


def test_auto_falls_back_by_priority_on_each_platform():
  assert registry.auto_backend("cpu", "cpu") == registry.REFERENCE
  assert registry.auto_backend("gpu", H100) == "pallas_gpu"
  assert registry.auto_backend("gpu", B200) == "pallas_gpu"
  assert registry.auto_backend("tpu", "TPU v5 lite") == "pallas_tpu"
  # A Hopper-only backend never runs compiled on Blackwell; every backend runs on its platforms only.
  assert not registry.get("mosaic_gpu").runs_on("gpu", B200) and registry.get("mosaic_gpu").runs_on("gpu", H100)
  assert not registry.get("pallas_gpu").runs_on("tpu", "TPU v5 lite")


def _lut(block_m: int) -> kernels.Lut:
  cfg = {"block_m": block_m, "block_k": 32, "block_n": 64, "num_warps": 4, "num_stages": 2, "group_m": 1, "group_k": 1}
  return kernels.Lut.from_dict(
    {
      "schema": "ragtune-lut",
      "schema_version": 2,
      "device_kind": "cpu",
      "entries": [
        {"op": "fwd", "backend": "pallas_gpu", "dtype": "float32", "m": 64, "k": 32, "n": 48, "g": 3, "config": cfg}
      ],
    }
  )


def _block_m() -> int:
  return kernels.explain((64, 32), (3, 32, 48), jnp.float32, backend="pallas_gpu")["fwd"].config.block_m


def test_use_lut_holds_for_its_block_and_context_only():
  kernels.lut.set_active_lut(_lut(16))
  assert _block_m() == 16
  seen = {}
  with kernels.use_lut(_lut(32)) as scoped:
    assert scoped.entries()[0].config.block_m == 32 and _block_m() == 32
    with kernels.use_lut(None):  # no LUT: the heuristic
      assert kernels.explain((64, 32), (3, 32, 48), jnp.float32, backend="pallas_gpu")["fwd"].source == "heuristic"
    assert _block_m() == 32
    t = threading.Thread(target=lambda: seen.setdefault("other thread", _block_m()))
    t.start()
    t.join()
  assert seen["other thread"] == 16, "another thread keeps the process's LUT"
  assert _block_m() == 16


def test_auto_asks_the_lut_on_a_tpu_too(monkeypatch):
  """On a TPU, "auto" takes each op's fastest correct entry, XLA's included, as on a GPU."""
  monkeypatch.setattr(kernels.target, "current", lambda: kernels.target.Target("tpu", "TPU v5 lite", None))
  entry = {"dtype": "bfloat16", "m": 512, "k": 256, "n": 384, "g": 4}
  lut = kernels.Lut.from_dict(
    {
      "schema": "ragtune-lut",
      "schema_version": 2,
      "device_kind": "TPU v5 lite",
      "entries": [
        {"op": "fwd", "backend": "pallas_tpu", "config": {"tm": 128, "tk": 128, "tn": 128}, "time_s": 2e-3, **entry},
        {"op": "fwd", "backend": "xla", "config": {}, "time_s": 1e-3, **entry},
        {"op": "dlhs", "backend": "pallas_tpu", "config": {"tm": 256, "tk": 128, "tn": 128}, "time_s": 1e-3, **entry},
        {"op": "dlhs", "backend": "xla", "config": {}, "time_s": 2e-3, **entry},
      ],
    }
  )
  with kernels.use_lut(lut):
    got = kernels.explain((512, 256), (4, 256, 384), jnp.bfloat16)
  assert (got["fwd"].backend, got["fwd"].source) == ("xla", "lut-exact")
  assert (got["dlhs"].backend, got["dlhs"].config) == ("pallas_tpu", kernels.TpuConfig(256, 128, 128))
  assert (got["drhs"].backend, got["drhs"].source) == ("pallas_tpu", "compile-verified")


def test_interpreter_env_sizes_xla_cpu_pool_on_small_hosts(monkeypatch):
  """jax's Mosaic GPU interpreter blocks a host callback per simulated warpgroup (and per warp
  of a warp_map) plus one for the launch; on a host with fewer cores, XLA:CPU's intra-op pool
  must be made larger."""
  monkeypatch.setattr(registry, "host_cores", lambda: 2)
  blocking = max(b.interpreter_threads for b in registry.REGISTRY.values())
  assert registry.get("mosaic_gpu").interpreter_threads == 3  # two consumer warpgroups and a producer
  assert blocking == 7  # mosaic_blackwell's tgmm: three warpgroups, one running four warps
  assert registry.interpreter_env({}) == {"PJRT_NPROC": "16"}
  assert registry.interpreter_env({"PJRT_NPROC": "4"}) == {} == registry.interpreter_env({"NPROC": "4"})
  monkeypatch.setattr(registry, "host_cores", lambda: 64)
  assert registry.interpreter_env({}) == {}


def test_the_test_processes_have_the_interpreters_pool():
  import os

  assert registry.interpreter_env() == {}, "tests/conftest.py sets it before jax starts"
  assert os.environ.get("PJRT_NPROC") or registry.host_cores() >= 8


def test_every_backend_with_kernels_has_an_interpreter_and_its_cost():
  """ragtune's estimate of a sweep on a CPU costs a backend's grid_work with its
  interpret_cost: a backend with kernels of its own names the interpreter that runs them and
  what they cost there; one without (XLA's) has neither."""
  for b in registry.REGISTRY.values():
    assert (b.interpret_cost is not None) == b.own_kernels == bool(b.interpreter), b.name


# What each backend refuses: lhs x rhs dtype pairs whose promotion it does not compute in.
F32_PROMOTIONS = {
  ("float32", "float32"),
  ("float32", "bfloat16"),
  ("bfloat16", "float32"),
  ("float32", "float16"),
  ("float16", "float32"),
  ("bfloat16", "float16"),  # bfloat16 x float16 promotes to float32
  ("float16", "bfloat16"),
}
REFUSED = {
  "pallas_gpu": set(),
  "mosaic_gpu": F32_PROMOTIONS,
  "mosaic_blackwell": F32_PROMOTIONS,
  "pallas_tpu": {("float16", "float16")},
  "xla": set(),
}


@pytest.mark.parametrize("name", registry.NAMES)
def test_a_backend_refuses_the_dtypes_it_lacks_before_any_kernel(name):
  """The refusals of the conformance suite's dtype cases (test_dtypes, test_mixed_dtypes_follow_lax),
  which for the Mosaic GPU backends run in CI only in this form: ragged_dot refuses before a
  kernel is traced, so no interpreter is needed, for every pair of dtypes whose promotion the
  backend lacks, with the error that names the alternatives."""
  refused = set()
  for lhs_dt, rhs_dt in itertools.product(common.DTYPES, repeat=2):
    lhs, rhs, gs = jnp.zeros((4, 8), lhs_dt), jnp.zeros((2, 8, 8), rhs_dt), jnp.array([2, 2], jnp.int32)
    if jnp.promote_types(lhs_dt, rhs_dt).name in registry.get(name).dtypes:
      continue  # runs a kernel: the conformance suite's
    with pytest.raises(TypeError, match=rf"backend '{name}' supports lhs/rhs dtypes .*, got {lhs_dt} x {rhs_dt}; use"):
      kernels.ragged_dot(lhs, rhs, gs, backend=name, interpret=True)
    refused.add((lhs_dt, rhs_dt))
  assert refused == REFUSED[name]
