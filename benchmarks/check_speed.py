"""How fast the check runs (ragtune.device.numerics.compare): ns an element on this machine's
default device, on a float32 reference and a bf16 output of --elements elements in rows of
--cols, beside (--against REV) the compare of another git revision run on the same arrays
(09aada7 and before compared on the host, in float64 NumPy). It prints what a DeepSeek-V3
drhs check ([131072,7168]x[256,7168,2048]: 3.76e9 output elements) costs at that rate, and a
model for GPUs: the bytes the check reads (the reference twice, for its scale and for the
comparison, and the output once: 10 bytes an element) over the HBM bandwidth, a lower bound
that leaves out the loop's per-step launches. --memory also compiles (nothing run) the check
at DeepSeek-V3 drhs and prints XLA's memory analysis, here and (gpu-compile extra) for an H100.

  python benchmarks/check_speed.py --elements 2e8 --against 09aada7 --memory

The arrays need 6 bytes an element on the device (and --against 6 more on the host).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from kernels import gpus  # noqa: E402
from ragtune.device import numerics  # noqa: E402

DSV3_DRHS = 256 * 7168 * 2048  # output elements of DeepSeek-V3 prefill's drhs
BYTES_READ = 4 + 4 + 2  # a float32 reference read twice (scale, comparison), a bf16 output once
# HBM bandwidth (bytes/s), from the GPUs' facts files (kernels/gpu_facts/: NVIDIA's product pages).
HBM = {gpus.gpu(n).title: gpus.peaks(gpus.gpu(n).device_kind)[1] * 1e9 for n in ("h100", "h200")}


def _best(fn, repeat: int) -> float:
  fn()  # compile, and the first run
  times = []
  for _ in range(repeat):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times)


def _old_compare(rev: str):
  """compare() from ragtune/device/numerics.py at git revision `rev`."""
  root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
  text = subprocess.run(
    ["git", "-C", root, "show", f"{rev}:ragtune/device/numerics.py"], capture_output=True, text=True, check=True
  ).stdout
  with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
    f.write(text)
  spec = importlib.util.spec_from_file_location("numerics_at_rev", f.name)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up
  spec.loader.exec_module(module)
  os.unlink(f.name)
  return module.compare


def _memory() -> None:
  out = (256, 7168, 2048)  # drhs's [g, k, n], as the check gets it
  fn = functools.partial(numerics._reduce, region_grid=(2, 2), default_atol=True)
  args = (out, jnp.float32), (out, jnp.bfloat16), ((), jnp.float32), ((), jnp.float32)
  structs = [jax.ShapeDtypeStruct(s, d) for s, d in args]
  m = jax.jit(fn).lower(*structs).compile().memory_analysis()
  print(
    f"DeepSeek-V3 drhs check, XLA on {jax.devices()[0].platform}: arguments {m.argument_size_in_bytes / 1e9:.1f} GB, "
    f"temporaries {m.temp_size_in_bytes / 1e6:.0f} MB"
  )
  try:
    from ragtune.deviceless import aot

    r = aot.compile_fn("h100", fn, *args, expect_kernel=False)
  except Exception as e:  # noqa: BLE001 - the gpu-compile extra is optional
    print(f"(no deviceless H100 compile: {type(e).__name__}: {str(e)[:120]})")
    return
  if r.memory is not None:
    print(f"  deviceless H100: temporaries {r.memory.temp / 1e6:.0f} MB ({r.outcome})")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--elements", type=float, default=2e8)
  ap.add_argument("--cols", type=int, default=2048)
  ap.add_argument("--repeat", type=int, default=3)
  ap.add_argument("--against", metavar="REV", help="also time compare() of this git revision")
  ap.add_argument("--memory", action="store_true", help="XLA's memory analysis of the check at DeepSeek-V3 drhs")
  a = ap.parse_args()
  rows = max(1, int(a.elements) // a.cols)
  n = rows * a.cols
  ref = jax.random.normal(jax.random.key(0), (rows, a.cols), jnp.float32)
  test = (ref + 1e-2 * jax.random.normal(jax.random.key(1), (rows, a.cols), jnp.float32)).astype(jnp.bfloat16)
  jax.block_until_ready((ref, test))
  device = jax.devices()[0]
  print(f"{device.platform} ({device.device_kind}), jax {jax.__version__}: [{rows}, {a.cols}] = {n:.3g} elements")
  t0 = time.perf_counter()
  result = numerics.compare(ref, test, rtol=2e-2)
  print(f"first call (compile and run): {time.perf_counter() - t0:.2f} s; {result.summary()}")
  t = _best(lambda: numerics.compare(ref, test, rtol=2e-2), a.repeat)
  print(f"device check: {t:.3f} s, {t / n * 1e9:.2f} ns/element -> DeepSeek-V3 drhs {t / n * DSV3_DRHS:.1f} s")
  if a.against:
    old = _old_compare(a.against)
    host_ref, host_test = np.asarray(ref), np.asarray(test)
    t_old = _best(lambda: old(host_ref, host_test, rtol=2e-2), a.repeat)
    print(
      f"{a.against}'s check: {t_old:.3f} s, {t_old / n * 1e9:.2f} ns/element -> DeepSeek-V3 drhs "
      f"{t_old / n * DSV3_DRHS:.1f} s ({t_old / t:.1f}x the device check)"
    )
  for name, bw in HBM.items():
    ms = DSV3_DRHS * BYTES_READ / bw * 1e3
    print(f"model, {name}: {BYTES_READ} B/element / {bw / 1e12:.2f} TB/s -> DeepSeek-V3 drhs {ms:.1f} ms")
  if a.memory:
    _memory()


if __name__ == "__main__":
  main()
