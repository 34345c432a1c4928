"""Worker processes: each one compiles, checks and times candidates on one device.

The parent (ragtune/run/pool.py) is the only writer of records.jsonl. A worker holds one
problem at a time: it builds inputs and the reference once, then measures the items it
is sent (baselines and candidates) one by one and streams a row back for each.

The parent enforces the per-candidate timeout by killing the worker process, so a hung
computation is stopped, not abandoned; a worker that dies (signal, CUDA error, OOM) is
seen as end-of-file on its pipe. Either way the parent starts a fresh worker.

Messages (a ragtune.run.child channel):
  parent -> worker: ("start",) first: a spare worker has imported everything but opens its
                    device only then, so a replacement is ready at once after a kill
                    then ("run", problem, [(candidate_id, config), ...], options) | ("ceilings", dtypes) | ("exit",)
  worker -> parent: ("hello", device_fields) | ("begin", candidate_id) | ("row", row)
                    | ("done", problem_key) | ("ceilings", data)
                    | ("retire", reason): after a fault that may have poisoned the device
                      context; the worker exits and the parent starts a fresh one

This module must not import jax at the top: the device is pinned (CUDA_VISIBLE_DEVICES,
set by the parent in the environment) before jax starts.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import importlib
import os
import re
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
  from ragtune.records.store import Record

from ragtune.run.child import Channel


def load_function(spec: str, option: str = "--builder"):
  """'module:function' -> the function; raises ValueError with a readable reason that names
  the option it came from."""
  mod_name, sep, fn_name = spec.partition(":")
  if not sep or not mod_name or not fn_name.isidentifier():
    raise ValueError(f"{option} must look like module:function, got {spec!r}")
  try:
    mod = importlib.import_module(mod_name)
  except Exception as e:  # not found, or the module raised as it ran
    raise ValueError(f"{option} {spec}: cannot import {mod_name!r} ({type(e).__name__}: {e})") from None
  fn = getattr(mod, fn_name, None)
  if not callable(fn):
    raise ValueError(f"{option} {spec}: {mod_name} has no function {fn_name!r}")
  return fn


def load_builder(spec: str):
  return load_function(spec, "--builder")


class _Problem:
  """Inputs and reference of the problem the worker holds."""

  def __init__(self, p, opts: dict[str, Any]):
    from ragtune.device import measure
    from ragtune.problems import limits

    self.p = p
    self.x = measure.make_inputs(p)
    self.args = measure.op_args(p.op, self.x)
    self.memory = limits.device_memory_bytes()
    self.ref = measure.reference(p.op, self.x, measure.out_dtype(p), p.dtype)
    self.builder = load_builder(opts["builder"])


def _measure(state: _Problem, cid: str, config, opts: dict[str, Any], device: dict[str, Any]) -> Record:
  import jax

  from kernels import registry
  from ragtune.device import measure, xla_fit
  from ragtune.records.store import make_row

  p = state.p
  interpret = opts["interpret"]

  def row(status, **kw):
    return make_row(p, cid, config, status, interpret=interpret, device=device, **kw)

  if cid == "baseline:xla":
    if why := xla_fit.refusal(p, state.memory):  # asked before compiling: an H100 ran out of memory on it
      return row("too_big", error=why)
    fn, args, do_check = measure.build_op(p, registry.REFERENCE, None, False), state.args, False
  elif cid == "baseline:dense":
    fn, args, do_check = measure.dense_matmul, measure.dense_args(p, state.x), False
  else:
    try:
      fn = state.builder(p, p.backend, config, interpret)
    except Exception as e:  # noqa: BLE001 - a failing candidate is data
      return row("compile_error", error=measure.error_text(e))
    args, do_check = state.args, True
  try:
    compiled = measure.compile_fn(fn, args)
  except Exception as e:  # noqa: BLE001
    return row("compile_error", error=measure.error_text(e))
  if why := xla_fit.compiled_refusal(compiled, state.memory):
    return row("too_big", error=why)
  try:
    out = jax.block_until_ready(compiled(*args))
  except Exception as e:  # noqa: BLE001
    return row("run_error", error=measure.error_text(e))
  numerics = measure.check(p, out, state.ref) if do_check else None
  if numerics is not None and not numerics.passed:
    return row(numerics.status, error=numerics.summary(), numerics=numerics)
  try:
    times, timer = measure.time_variants({cid: (fn, args, compiled)}, on_device=device["platform"] != "cpu")
  except Exception as e:  # noqa: BLE001
    return row("run_error", error=measure.error_text(e), numerics=numerics)
  t = times.get(cid)
  if t is None or not t > 0:
    return row("timing_error", error="no timing was recorded", numerics=numerics)
  return row("ok", time_s=t, timer=timer, numerics=numerics)


_POISON = re.compile(r"CUDA_ERROR|cudaError|illegal (memory )?address|misaligned address|unspecified launch failure")


def _poisoned(row: Record, platform: str) -> bool:
  """Whether this process should not time anything more: a failed run on an accelerator
  (an illegal address or the like can leave the device context unusable), or any error
  that names such a fault. The parent then starts a fresh worker."""
  if row.status not in ("run_error", "compile_error", "timing_error"):
    return False
  return (platform != "cpu" and row.status == "run_error") or bool(_POISON.search(row.error))


def main() -> None:
  channel = Channel()
  faulthandler.enable()  # a fatal signal leaves a Python stack in the stderr tail

  import jax

  from ragtune import provenance

  importlib.import_module(
    "ragtune.records.store"
  )  # and ragtune.device.measure: imported now, while the worker may be a spare

  # A spare waits here, imports done, until the parent needs it; only then does it open
  # the device (two processes must not both take a GPU's memory).
  msg = channel.recv()
  if msg is None or msg[0] != "start":
    return
  index = int(os.environ.get("RAGTUNE_DEVICE_INDEX", "0"))
  devices = jax.local_devices()
  if devices[0].platform == "cpu" and index < len(devices):
    jax.config.update("jax_default_device", devices[index])  # GPUs are pinned by CUDA_VISIBLE_DEVICES
  dev = devices[index] if devices[0].platform == "cpu" and index < len(devices) else devices[0]
  versions = provenance.for_device(dev)  # read here: the parent never opens the device
  device = {
    "device_kind": dev.device_kind,
    "platform": dev.platform,
    "jax_version": versions.jax,
    "device_index": index,
    "worker_pid": os.getpid(),
    "versions": versions,
  }
  channel.send(("hello", device))

  state: _Problem | None = None
  while True:
    msg = channel.recv()
    if msg is None or msg[0] == "exit":
      return
    if msg[0] == "ceilings":
      from ragtune.device import ceilings

      channel.send(("ceilings", ceilings.measure_ceilings(msg[1], device["platform"])))
      continue
    _, p, items, opts = msg
    if state is None or state.p != p:
      state = None  # free the last problem's buffers first
      state = _Problem(p, opts)
    for cid, config in items:
      channel.send(("begin", cid))
      t0 = time.perf_counter()
      r = _measure(state, cid, config, opts, device)
      r = dataclasses.replace(r, elapsed_s=round(time.perf_counter() - t0, 4))
      channel.send(("row", r))
      if _poisoned(r, device["platform"]):
        channel.send(("retire", r.error[:200]))
        return
    channel.send(("done", p.key))


if __name__ == "__main__":
  main()
