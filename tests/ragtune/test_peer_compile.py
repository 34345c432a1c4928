"""benchmarks/peer_compile.py: tokamax's ragged_dot and ragtune's defaults compiled
deviceless for a GPU, one table of what their kernels are made of."""

import contextlib
import os
import re

import pytest
from conftest import load_benchmark
from test_aot_compile import _UNAVAILABLE

from ragtune.deviceless import aot
from ragtune.lut import bench


def _peer():
  return load_benchmark("peer_compile")


def _kernel(name: str, **kw) -> aot.KernelReport:
  facts = dict(registers=168, spill_bytes=0, stack_bytes=0, smem_bytes=None, smem_source="", mma="wgmma")
  facts |= dict(copy="tma", counts={"HGMMA": 8, "UTMALDG": 4}, serialized_wgmma=False, loops_wait_one=True)
  facts |= dict(loop_spills=0, setmaxnreg=True, hgmma_n=256)
  return aot.KernelReport(name, **{**facts, **kw})


def test_a_library_that_fails_is_a_row_and_the_others_go_on(monkeypatch):
  peer = _peer()
  monkeypatch.setattr(peer, "cross_compile_tokamax", lambda target: contextlib.nullcontext((object(), "")))

  monkeypatch.setattr(bench, "tokamax_missing", lambda impl: None)

  def fake(target, lib, op, m, k, n, g, tokamax):
    if lib == "ragtune:mosaic_gpu":
      raise AttributeError("'TileSchedule' object has no attribute 'x'\nmore")
    if lib == "tokamax:triton":
      return aot.CompileReport(target, "H100", aot.OK, "", 2.0), "64x32x64 (cache)"  # built, but no MMA kernel
    kr = _kernel("kernel_body", loop_spills=12, serialized_wgmma=True, counts={"HGMMA": 8}, copy="cp.async")
    rep = aot.CompileReport(target, "H100", aot.LOOP_SPILL, "kernel_body: 12 STL/LDL", 3.0, (kr, _kernel("k2")))
    return rep, "128x64x128 (heuristic)"

  libs = ["tokamax:triton", "tokamax:mosaic_gpu", "ragtune:mosaic_gpu"]
  rows = peer.peer_rows("h100", ["dsv3-decode"], ["fwd"], libs, compile_one=fake, log=lambda _: None)
  got = [(r.library, r.outcome, r.kernel.name if r.kernel else None) for r in rows]
  assert got == [
    ("tokamax:triton", aot.OK, None),
    ("tokamax:mosaic_gpu", aot.LOOP_SPILL, "kernel_body"),
    ("tokamax:mosaic_gpu", aot.LOOP_SPILL, "k2"),
    ("ragtune:mosaic_gpu", aot.ERROR, None),
  ]
  lines = peer.table(rows).splitlines()
  cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
  head = cells[0]
  assert len(lines) == 2 + len(rows) and all(len(c) == len(head) for c in cells)
  row = dict(zip(head, cells[3]))
  assert (row["wgmma N"], row["setmaxnreg"], row["copy"], row["C7511"], row["loop spills"]) == (
    "256",
    "yes",
    "cp.async",
    "yes",
    "12",
  )
  assert row["tile mxkxn"] == "128x64x128 (heuristic)" and dict(zip(head, cells[4]))["copy"] == "tma"
  assert dict(zip(head, cells[2]))["outcome"] == "ok: no kernel issues an MMA instruction"
  assert dict(zip(head, cells[2]))["tile mxkxn"] == "64x32x64 (cache)"
  assert (
    dict(zip(head, cells[5]))["outcome"] == "compile_error: AttributeError: 'TileSchedule' object has no attribute 'x'"
  )


def test_an_absent_tokamax_implementation_is_a_row_saying_why(monkeypatch):
  """tokamax 0.0.15+ registers its native Triton ragged_dot only when jax_triton imports; a call
  by name would fail with "Unknown implementation". The row names the reason instead."""
  peer = _peer()
  monkeypatch.setattr(peer, "cross_compile_tokamax", lambda target: contextlib.nullcontext((object(), "")))
  why = "tokamax 0.0.17 has no 'triton' ragged_dot here: its triton.py fails to import (No module named 'jax_triton')"
  monkeypatch.setattr(bench, "tokamax_missing", lambda impl: why if impl == "triton" else None)
  built = []

  def fake(target, lib, *args):
    built.append(lib)
    return aot.CompileReport(target, "H100", aot.OK, "", 1.0, (_kernel("k"),)), "64x64x64 (cache)"

  logged = []
  libs = ["tokamax:triton", "tokamax:mosaic_gpu"]
  rows = peer.peer_rows("h100", ["dsv3-decode"], ["fwd"], libs, compile_one=fake, log=logged.append)
  assert built == ["tokamax:mosaic_gpu"], "an absent implementation is not called"
  assert (rows[0].outcome, rows[0].error, rows[0].kernel) == (aot.UNSUPPORTED, why, None)
  assert rows[1].outcome == aot.OK and logged[0] == f"dsv3-decode fwd tokamax:triton: absent: {why}"
  assert f"unsupported: {why}" in peer.table(rows).splitlines()[2]


@pytest.mark.parametrize(
  "argv,error",
  [
    (["--only", "mixtral"], "error: unknown anchor ['mixtral']"),
    (["--lib", "tokamax:mosaic"], "error: unknown library ['tokamax:mosaic']"),
    (["--op", "bwd"], "error: unknown op ['bwd']"),
    (["--target", "h800"], "error: --target h800: not one of"),
  ],
)
def test_bad_input_is_one_error_line(argv, error, capsys):
  assert _peer().main(argv) == 2
  out, err = capsys.readouterr()
  assert err.startswith(error) and err.count("\n") == 1 and out == "", err


@pytest.mark.skipif(_UNAVAILABLE is not None, reason=str(_UNAVAILABLE))
def test_tokamax_compiles_for_h100_and_is_read_like_ragtune():
  """tokamax's Triton ragged_dot (Pallas Triton up to 0.0.14, native Triton from 0.0.15) builds
  for an H100 from this CPU host (its hardware check off, the compile-only device as jax's
  default, native Triton's PTX for XLA's ptxas) and its kernel is read like ragtune's: wgmma,
  no spill; XLA's fusions around it are left out. Its tile is the config tokamax picked (its
  cache has Mixtral's forward shape). The patches are gone afterwards."""
  pytest.importorskip("tokamax")
  from jax.extend import backend

  peer = _peer()
  if why := bench.tokamax_missing("triton"):
    pytest.skip(why)
  before, env = backend.get_default_device, dict(os.environ)
  (r,) = peer.peer_rows("h100", ["mixtral-8x7b"], ["fwd"], ["tokamax:triton"], log=lambda _: None)
  assert r.outcome == aot.OK and r.kernel.mma == "wgmma" and r.kernel.hgmma_n >= 64, r
  assert r.kernel.spill_bytes == 0 and r.kernel.loop_spills == 0 and not r.kernel.name.endswith("fusion"), r
  assert re.fullmatch(r"\d+x\d+x\d+ \(cache\)", r.tile), r.tile
  assert backend.get_default_device is before and all(os.environ.get(k) == env.get(k) for k in peer.TRITON_PTXAS)
