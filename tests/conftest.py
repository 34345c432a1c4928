import importlib.util
import os
import tempfile
from pathlib import Path

# Two host devices so shard_map tests have a real 2-way mesh on CPU. Must precede jax import.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
# The CUDA plugin (the gpu-compile extra) or libtpu (the tpu extra) on a host with no
# accelerator at all: keep jax on the CPU, so they serve deviceless compiles
# (tests/ragtune/test_aot_compile.py, test_aot_tpu.py) instead of failing to start. NVIDIA
# (and WSL's /dev/dxg), ROCm and TPU hosts are left alone.
_ACCELERATORS = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg", "/dev/kfd", "/dev/accel0", "/dev/vfio/0")
_PLUGINS = ("jax_plugins", "libtpu")
if any(importlib.util.find_spec(p) for p in _PLUGINS) and not any(os.path.exists(p) for p in _ACCELERATORS):
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  # libtpu admits one process a host unless told otherwise; the xdist workers each compile.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.pop("RAGTUNE_LUT", None)
# The interpreter's calibration (ragtune.run.estimate) is cached under $XDG_CACHE_HOME: keep the
# tests' out of the user's home, shared by the xdist workers and by later runs.
os.environ["XDG_CACHE_HOME"] = os.path.join(tempfile.gettempdir(), f"ragtune-tests-cache-{os.getuid()}")
# Processes the tests start (the CLI, sweep workers) import this checkout too, from any
# folder: from tests/, tests/kernels and tests/ragtune would be namespace packages.
ROOT = Path(__file__).resolve().parents[1]
# tests/site's sitecustomize compiles XLA:CPU programs without LLVM's optimizations (most of the
# suite's time): in this process, and in those it starts, where Python imports it at start-up.
SITE = ROOT / "tests" / "site"
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), str(SITE), os.environ.get("PYTHONPATH")) if p)
_site = importlib.util.spec_from_file_location("tests_site", SITE / "sitecustomize.py")
_site.loader.exec_module(importlib.util.module_from_spec(_site))  # this process started without it

import jax  # noqa: E402

# jax's Mosaic GPU interpreter runs each simulated warpgroup as a jitted program on a host
# thread that blocks in callbacks at barriers; inline dispatch keeps them off the CPU client's
# few worker threads.
jax.config.update("jax_cpu_enable_async_dispatch", False)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import kernels  # noqa: E402

# Before any jax computation (jax makes its CPU client then): an XLA:CPU pool large enough for
# the interpreted Mosaic GPU kernels, here, in the xdist workers and in every child.
os.environ.update(kernels.registry.interpreter_env())

# Cases that run a warp-specialized Mosaic GPU kernel in jax's interpreter (marked
# mgpu_interpret) each run in a child process with a deadline, on every path (a plain
# pytest, xdist, CI): a kernel that deadlocks leaves threads blocked in native code, where no
# signal reaches them, so the parent kills the child and fails the case with the child's
# stacks (faulthandler). See docs/tests.md.
MGPU_CHILD = "RAGTUNE_MGPU_INTERPRETER_CHILD"
MGPU_DEADLINE_S = float(os.environ.get("RAGTUNE_MGPU_DEADLINE_S", 300))
# Under CI, a few of each backend's. Hopper's gmm with the H100 default over a transposed rhs:
# its consumers splitting rows, and its narrow cells splitting columns, on a routing that ends
# groups at every tail case (group starts off 8-row multiples, an empty group, group_offset,
# ragged k and n): under jax 0.10.2 it runs the kernel through tests/kernels/mgpu_interpret.py's
# transposed reads, its interpreter taking 15-70 s a case; CI's second stack (jax 0.12, 5-20 s a case)
# runs RAGTUNE_MGPU_CORE's larger set, Hopper's tgmm and conformance cases with it. Blackwell's
# gmm over a transposed rhs with its ring and accumulators carried across cells, its tgmm, and
# one conformance case (fwd, dlhs and drhs against NumPy over four group-size patterns; jax
# 0.12's interpreter only: under jax 0.10.2 they skip). RAGTUNE_MGPU_ALL=1 runs every one, as a
# run outside CI does.
MGPU_ALL = "RAGTUNE_MGPU_ALL"
CI_MGPU_CASES = (
  "test_mosaic_gpu.py::test_gmm_narrow_tail_cells_in_interpreter[h100-default-transposed]",
  "test_conformance.py::test_group_sizes[mosaic_blackwell-kn]",
  "test_mosaic_blackwell.py::test_gmm_ring_and_accumulators_carry_across_cells[nk]",
  "test_mosaic_blackwell.py::test_tgmm_masks_neighbours_rows_and_zeroes_empty_groups",
  "test_quantized.py::test_fp8_pipeline_reaches_ragged_dot[mosaic_gpu]",
  "test_fp8_training.py::test_mosaic_gpu_training_in_interpreter",
  "test_fp8_training.py::test_mutations_fail[mosaic_gpu]",
)
# The backends jax's Mosaic GPU interpreter runs: their conformance cases are mgpu_interpret.
MGPU_BACKENDS = tuple(name for name, b in kernels.registry.REGISTRY.items() if b.interpreter == "mosaic_gpu")
# RAGTUNE_MGPU_CORE=1 (CI's second stack, whose interpreter is the fast one): CI's few, every
# case of the backends' own files, and the conformance cases that reach the kernels in a way
# no other case does: both rhs layouts (fwd, dlhs and drhs over four group-size patterns), a
# shape below every block, many small groups off the block grid, a group_offset shard, the
# tiles an H100 and a B200 run (each backend's device defaults) on a ragged shape, and vmap
# (plgpu.kernel's own vmap rule: one more grid axis, refs sliced per example). What each of
# the others reaches, one of these reaches too: docs/tests.md, "Interpreted cases outside CI".
MGPU_CORE = "RAGTUNE_MGPU_CORE"
CORE_CONFORMANCE = (
  "test_group_sizes[{b}-kn]",
  "test_group_sizes[{b}-nk]",
  "test_shapes[{b}-tiny_k8_n16]",
  "test_many_small_groups_off_the_block_grid[{b}]",
  "test_group_offset_shards[{b}-kn]",
  "test_device_defaults[{b}]",
  "test_vmap_other_forms[{b}-group_sizes_offset]",
)


def _mgpu_cases_to_run() -> set[str] | None:
  """The interpreted Mosaic GPU cases this run keeps (file::name ids); None for all of them."""
  if not os.environ.get("CI") or os.environ.get(MGPU_ALL):
    return None
  keep = set(CI_MGPU_CASES)
  if os.environ.get(MGPU_CORE):
    keep |= {f"test_conformance.py::{c.format(b=b)}" for b in MGPU_BACKENDS for c in CORE_CONFORMANCE}
    keep |= {"test_mosaic_gpu.py::*", "test_mosaic_blackwell.py::*"}
  return keep


def pytest_collection_modifyitems(config, items):
  if os.environ.get(MGPU_CHILD):
    return
  for item in items:
    if "test_conformance.py" in item.nodeid and any(f"[{b}" in item.nodeid for b in MGPU_BACKENDS):
      item.add_marker(pytest.mark.mgpu_interpret)
  keep = _mgpu_cases_to_run()
  if keep is None:
    return
  if not (config.option.keyword or config.option.markexpr):  # a renamed case would silently leave CI's cases
    files = {item.nodeid.split("::")[0].rsplit("/", 1)[-1] for item in items}
    ids = {item.nodeid.rsplit("/", 1)[-1] for item in items}
    missing = [c for c in keep if c.split("::")[0] in files and not c.endswith("*") and c not in ids]
    if missing:
      raise pytest.UsageError(f"the CI cases name cases that are not collected: {sorted(missing)}")
  for item in items:
    node = item.nodeid.rsplit("/", 1)[-1]
    if item.get_closest_marker("mgpu_interpret") and node not in keep and node.split("::")[0] + "::*" not in keep:
      item.add_marker(pytest.mark.skip(reason=f"interpreted Mosaic GPU case outside CI's set: set {MGPU_ALL}=1"))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
  """An mgpu_interpret case runs in `python -m pytest <its id>` with a deadline."""
  if not pyfuncitem.get_closest_marker("mgpu_interpret") or os.environ.get(MGPU_CHILD):
    return None
  import signal
  import subprocess
  import sys

  deadline = MGPU_DEADLINE_S
  # The child dumps every thread's stack (faulthandler, a C thread: it needs no GIL) before
  # the parent's deadline, then the parent kills its whole process group.
  # Without hypothesis's plugin, which imports hypothesis (0.8 s) for its summary in every
  # pytest process; no interpreted case draws with hypothesis.
  cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-n", "0", "-p", "no:cacheprovider", "-p", "no:hypothesispytest"]
  cmd += ["-o", f"faulthandler_timeout={max(deadline - 15, 1):.0f}", "--timeout", "0", pyfuncitem.nodeid]
  env = dict(os.environ, **{MGPU_CHILD: "1"})
  child = subprocess.Popen(
    cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
  )
  try:
    out, _ = child.communicate(timeout=deadline)
  except subprocess.TimeoutExpired:
    os.killpg(child.pid, signal.SIGKILL)
    out, _ = child.communicate()
    pytest.fail(f"no result within {deadline:.0f} s (a deadlock?); the child's last output:\n{out[-8000:]}")
  # -q twice (addopts) leaves no count line: the skip reason comes from -rs's summary.
  skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
  if child.returncode == 0 and skipped:
    pytest.skip(skipped[-1].split(": ", 1)[-1])
  if child.returncode != 0:
    pytest.fail(f"the child pytest failed (exit {child.returncode}):\n{out[-8000:]}", pytrace=False)
  return True


def needs_compiler(why: str | None, what: str):
  """skipif for a module of deviceless compile tests, `why` the compiler is unavailable
  (None: it is here). Under CI, on a CPU-only jax, a missing compiler is an error instead."""
  if why and os.environ.get("CI") and jax.default_backend() == "cpu":
    raise RuntimeError(f"CI must run the {what}: {why}")
  return pytest.mark.skipif(why is not None, reason=str(why))


def module_found(name: str) -> bool:
  """Whether module `name` can be imported, without importing it. find_spec imports a dotted
  name's parents and raises where one is missing (an install without the gpu-compile extra has
  no jax_plugins package at all): that is not found, not an error."""
  try:
    return importlib.util.find_spec(name) is not None
  except ModuleNotFoundError:
    return False


def gpu_compile_missing() -> str | None:
  """Why the deviceless GPU compile tests (tests/ragtune/test_aot_compile.py) cannot run in
  this process, or None."""
  from ragtune.provenance import find_tool

  if not any(module_found(p) for p in ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")):
    return "no CUDA plugin (pip install -e '.[gpu-compile]')"
  if find_tool("cuobjdump") is None:
    return "no cuobjdump (pip install -e '.[gpu-compile]')"
  return compiler_missing("h100")


def compiler_missing(target: str) -> str | None:
  """Why ragtune.deviceless.aot cannot compile for `target` in this process, or None."""
  from ragtune.deviceless import aot

  if jax.default_backend() != "cpu":
    return "deviceless compile runs on a CPU-only jax (JAX_PLATFORMS=cpu)"
  try:
    aot.device_kind(target)
  except aot.AotUnavailable as e:
    return str(e)
  return None


def np_ragged_dot(lhs, rhs, group_sizes, *, transpose_rhs=False, group_offset=0):
  """float64 reference; rhs holds groups [group_offset, group_offset + g_local)."""
  lhs = np.asarray(lhs, np.float64)
  rhs = np.asarray(rhs, np.float64)
  if transpose_rhs:
    rhs = rhs.transpose(0, 2, 1)
  m = lhs.shape[0]
  out = np.zeros((m, rhs.shape[2]))
  start = 0
  for gi, size in enumerate(np.asarray(group_sizes)):
    end = min(start + int(size), m)
    local = gi - group_offset
    if 0 <= local < rhs.shape[0]:
      out[start:end] = lhs[start:end] @ rhs[local]
    start = end
  return out


def np_ragged_dot_grads(lhs, rhs, group_sizes, dout, *, transpose_rhs=False, group_offset=0):
  """float64 (dlhs, drhs) of np_ragged_dot for the cotangent `dout`; drhs in rhs's layout."""
  lhs, rhs, dout = (np.asarray(a, np.float64) for a in (lhs, rhs, dout))
  rhs_kn = rhs.transpose(0, 2, 1) if transpose_rhs else rhs
  dlhs, drhs = np.zeros_like(lhs), np.zeros_like(rhs_kn)
  start = 0
  for gi, size in enumerate(np.asarray(group_sizes)):
    end = min(start + int(size), lhs.shape[0])
    local = gi - group_offset
    if 0 <= local < rhs.shape[0]:
      dlhs[start:end] = dout[start:end] @ rhs_kn[local].T
      drhs[local] = lhs[start:end].T @ dout[start:end]
    start = end
  return dlhs, drhs.transpose(0, 2, 1) if transpose_rhs else drhs


def rand(key, shape, dtype):
  """Normal values fresh per seed `key`, over sqrt(last dim), plus 0.01 (never all zero), in
  `dtype`. Drawn by NumPy: jax.random compiles its generator for every new shape (0.2 s each,
  minutes over the suite), and inputs are not what a test checks."""
  x = np.random.default_rng(key).standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[-1]))
  return jnp.asarray(x.astype(jnp.dtype(dtype))) + 0.01


@pytest.fixture(autouse=True)
def _no_lut():
  """Tests start with no active LUT (heuristic configs) unless they load one."""
  kernels.lut.set_active_lut(None)
  yield
  kernels.lut.reset_active_lut()


def load_benchmark(name: str):
  """benchmarks/<name>.py as a module (benchmarks/ is no package)."""
  import importlib.util
  import sys

  spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
  mod = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = mod
  spec.loader.exec_module(mod)
  return mod


def entry_config(e):
  """A LUT query's config (None when nothing matched)."""
  return None if e is None else e.config


def entry_pick(e):
  """(backend, config) of a LUT query (None when nothing matched)."""
  return None if e is None else (e.backend, e.config)


def plan_of(backend, config, m, k, n, g, dtype):
  """(backend, config) per op, as ragged_dot resolves them."""
  from kernels.ragged_dot import resolve

  return {op: (c.backend, c.config) for op, c in resolve(config, backend, m, k, n, g, dtype).items()}


def selected_config(op, backend, m, k, n, g, dtype):
  """The config ragged_dot runs `op` with on `backend` when none is given."""
  from kernels.ragged_dot import resolve

  return resolve(None, backend, m, k, n, g, dtype)[op].config
