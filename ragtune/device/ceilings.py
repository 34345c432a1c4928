"""The device's limits, measured: dense-matmul TF/s per dtype and copy GB/s.

Measured once per (device kind, jax version) by a sweep's worker and kept in the results
folder as ceilings.json, so tables can say how far each problem is from them. On a CPU
host the sizes are small (it is a pipeline check, and the interpreter is what is timed).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ragtune.filekind import with_shards
from ragtune.paths import write_atomic

FILE = "ceilings.json"


def _key(device_kind: str, jax_version: str) -> str:
  return f"{device_kind}|{jax_version}"


def load(dirs: Iterable[str | Path]) -> dict[str, dict[str, Any]]:
  out: dict[str, dict[str, Any]] = {}
  for d in with_shards(dirs):
    path = Path(d) / FILE if Path(d).is_dir() else Path(d).with_name(FILE)
    try:
      data = json.loads(path.read_text())
    except (OSError, ValueError):
      continue
    if isinstance(data, dict):
      for k, v in data.items():
        out.setdefault(k, v)
  return out


def missing(out_dir: Path, device: dict[str, Any], dtypes: Iterable[str]) -> set[str]:
  have = load([out_dir]).get(_key(device["device_kind"], device["jax_version"]), {})
  if not have.get("copy_gbps"):
    return set(dtypes)
  return {d for d in dtypes if d not in have.get("matmul_tflops", {})}


def save(out_dir: Path, device: dict[str, Any], data: dict[str, Any]) -> None:
  path = Path(out_dir) / FILE
  try:
    current = json.loads(path.read_text())
  except (OSError, ValueError):
    current = {}
  k = _key(device["device_kind"], device["jax_version"])
  entry = current.get(k, {"device_kind": device["device_kind"], "jax_version": device["jax_version"]})
  entry.setdefault("matmul_tflops", {}).update(data["matmul_tflops"])
  entry.update({f: data[f] for f in data if f != "matmul_tflops"})
  current[k] = entry
  write_atomic(path, json.dumps(current, indent=1, sort_keys=True) + "\n")


def peaks(ceil: dict[str, dict[str, Any]], device_kind: str, jax_version: str | None, dtype: str):
  """(matmul TF/s, copy GB/s) for a row, preferring the same jax version; None where unknown."""
  entry = ceil.get(_key(device_kind, jax_version or "")) or next(
    (v for v in ceil.values() if v.get("device_kind") == device_kind), None
  )
  if not entry:
    return None, None
  return entry.get("matmul_tflops", {}).get(dtype), entry.get("copy_gbps")


def best_time(fn, *args, reps: int) -> float:
  """The fastest of `reps` runs of fn(*args), after one to warm up."""
  import jax

  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t0)
  return best


def measure_ceilings(dtypes: Iterable[str], platform: str) -> dict[str, Any]:
  """Runs on the worker's device. Large problems on an accelerator, small ones on a CPU.

  On an accelerator the times come from the same profiler timer as the kernels'
  (measure.time_variants), so a "% of peak" divides like by like; `timer` says which ran."""
  import jax
  import jax.numpy as jnp

  from kernels.common import element_dtype
  from ragtune.device import measure

  n, copy_elems, reps = (512, 8 << 20, 3) if platform == "cpu" else (8192, 256 << 20, 10)
  mm = measure.dense_matmul  # a quantized format's in its element dtype, f32 out
  copy = lambda v: v * 1.0001  # reads and writes every byte once
  fns, work = {}, {}
  for dtype in dtypes:
    k1, k2 = jax.random.split(jax.random.key(0))
    elem = element_dtype(dtype)
    args = (
      jax.random.normal(k1, (n, n), jnp.float32).astype(elem),
      jax.random.normal(k2, (n, n), jnp.float32).astype(elem),
    )
    fns[dtype] = (mm, args, measure.compile_fn(mm, args))
    work[dtype] = 2 * n**3
  x = jax.random.normal(jax.random.key(1), (copy_elems,), jnp.float32)
  fns["copy"] = (copy, (x,), measure.compile_fn(copy, (x,)))
  if platform == "cpu":
    times, timer = {k: best_time(c, *a, reps=reps) for k, (_, a, c) in fns.items()}, f"wallclock-best-of-{reps}"
  else:
    times, timer = measure.time_variants(fns, on_device=True, warmup=2, iters=reps)
  return {
    "matmul_tflops": {d: work[d] / times[d] / 1e12 for d in dtypes},
    "copy_gbps": 2 * x.nbytes / times["copy"] / 1e9,
    "sizes": {"matmul_n": n, "copy_bytes": int(x.nbytes)},
    "timer": timer,
    "measured": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
  }
