"""benchmarks/peer_compile.py: tokamax's ragged_dot, jax's Blackwell ragged_dot and
ragtune's defaults compiled deviceless for a GPU, one table of what their kernels are made of."""

import contextlib
import os
import re
import types

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
      return aot.CompileReport(target, "H100", aot.OK, "", 2.0), "64x32x64 (cache)", "?"  # built, but no MMA kernel
    kr = _kernel("kernel_body", loop_spills=12, serialized_wgmma=True, counts={"HGMMA": 8}, copy="cp.async")
    rep = aot.CompileReport(target, "H100", aot.LOOP_SPILL, "kernel_body: 12 STL/LDL", 3.0, (kr, _kernel("k2")))
    return rep, "128x64x128 (heuristic)", "?"

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
    return aot.CompileReport(target, "H100", aot.OK, "", 1.0, (_kernel("k"),)), "64x64x64 (cache)", "?"

  logged = []
  libs = ["tokamax:triton", "tokamax:mosaic_gpu"]
  rows = peer.peer_rows("h100", ["dsv3-decode"], ["fwd"], libs, compile_one=fake, log=logged.append)
  assert built == ["tokamax:mosaic_gpu"], "an absent implementation is not called"
  assert (rows[0].outcome, rows[0].error, rows[0].kernel) == (aot.UNSUPPORTED, why, None)
  assert rows[1].outcome == aot.OK and logged[0] == f"dsv3-decode fwd tokamax:triton: absent: {why}"
  assert f"unsupported: {why}" in peer.table(rows).splitlines()[2]


def test_a_blackwell_table_has_2cta_tmem_and_mma_columns(monkeypatch):
  """On a Blackwell target the table shows the CTA pair (from the machine code), the TMEM
  columns of the config (only for a kernel that allocates TMEM) and the MMA kind; a Hopper
  table of the same rows keeps its own columns."""
  peer = _peer()
  monkeypatch.setattr(peer, "cross_compile_tokamax", lambda target: contextlib.nullcontext((None, "")))
  tc = dict(mma="tcgen05.2cta", counts={"UTCHMMA": 4}, setmaxnreg=False, hgmma_n=0, tmem_alloc=True, cta_pair=True)

  def fake(target, lib, *args):
    if lib == "ragtune:mosaic_blackwell/pair":
      return (
        aot.CompileReport(target, "B200", aot.OK, "", 1.0, (_kernel("pair", **tc),)),
        "128x64x256, cell 256x256",
        "512",
      )
    k = _kernel("spilled", **{**tc, "cta_pair": False, "mma": "tcgen05", "loop_spills": 3})
    return (
      aot.CompileReport(target, "B200", aot.LOOP_SPILL, "spilled: 3 STL/LDL", 1.0, (k, _kernel("fusion"))),
      "-",
      "?",
    )

  libs = ["ragtune:mosaic_blackwell/pair", "jax:blackwell_ragged_dot"]
  rows = peer.peer_rows("b200", ["dsv3-decode"], ["fwd"], libs, compile_one=fake, log=lambda _: None)
  cells = [
    [c.strip() for c in line.strip("|").split("|")] for line in peer.table(rows, peer.BLACKWELL_COLUMNS).splitlines()
  ]
  got = [dict(zip(cells[0], c)) for c in cells[2:]]
  assert [(r["2-CTA"], r["TMEM cols"], r["mma"], r["loop spills"]) for r in got] == [
    ("yes", "512", "tcgen05.2cta", "0"),
    ("no", "?", "tcgen05", "3"),
    ("no", "-", "wgmma", "0"),  # a kernel that allocates no TMEM
  ]
  assert got[1]["outcome"] == "loop_spill: 3 STL/LDL", "the kernel's own name is its column, not its outcome's"
  hopper_head = [c.strip() for c in peer.table(rows).splitlines()[0].strip("|").split("|")]
  assert "wgmma N" not in cells[0] and hopper_head == list(peer.COLUMNS)


@pytest.mark.parametrize("op", ["fwd", "dlhs", "drhs"])
def test_the_cta_pair_variant_drives_every_anchor_on_b200(op):
  """ragtune:mosaic_blackwell/pair is the B200 default with cta_pair on and the pair's
  256-wide cell; it must be a config the kernel takes and that fits, or its rows would only
  say so."""
  peer = _peer()
  import kernels

  for name, (m, k, n, g, _) in peer.ANCHORS.items():
    cfg = kernels.registry.default_config("mosaic_blackwell", op, "bfloat16", m, k, n, g, device_kind="NVIDIA B200")
    pair = peer.cta_pair(cfg, op)
    assert pair.cta_pair and pair.cell(op) == (256, 256), (name, pair)
    assert pair.fits(op, "bfloat16", m, k, n, "NVIDIA B200"), (name, pair, pair.valid_for(op))


def test_jax_blackwell_misfit_names_the_dimension():
  peer = _peer()
  cfg = types.SimpleNamespace(tile_m=128, tile_n=128, tile_k=64, collective=True)
  assert peer.jax_blackwell_misfit(512, 7168, 2048, cfg) is None
  assert (
    peer.jax_blackwell_misfit(384, 7168, 2048, cfg) == "jax's kernel needs m a multiple of its 256-wide tile, got m=384"
  )
  assert peer.jax_blackwell_misfit(384, 7168, 2048, types.SimpleNamespace(**{**vars(cfg), "collective": False})) is None


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


@pytest.mark.skipif(_UNAVAILABLE is not None, reason=str(_UNAVAILABLE))
@pytest.mark.parametrize("target", ["h100", "b200"])
def test_each_generation_has_its_libraries_and_columns(target, monkeypatch, capsys):
  """Without --lib, an H100 table has the Hopper libraries and columns as before, a B200 one
  tokamax's, jax's and ragtune's Blackwell kernels with the 2-CTA and TMEM columns."""
  peer = _peer()
  asked = []
  monkeypatch.setattr(peer, "peer_rows", lambda target, problems, ops, libs: asked.append(libs) or [])
  assert peer.main(["--target", target, "--only", "dsv3-decode"]) == 0
  head = capsys.readouterr().out.splitlines()[1]
  blackwell = target == "b200"
  assert asked == [list(peer.BLACKWELL_LIBS if blackwell else peer.HOPPER_LIBS)]
  assert [c.strip() for c in head.strip("|").split("|")] == list(peer.BLACKWELL_COLUMNS if blackwell else peer.COLUMNS)


@pytest.mark.skipif(_UNAVAILABLE is not None, reason=str(_UNAVAILABLE))
def test_jax_blackwell_gradients_are_rows_saying_why_and_nothing_compiles(monkeypatch):
  """jax's Blackwell kernel is a forward ragged_dot: its dlhs and drhs rows say so at once."""
  peer = _peer()
  monkeypatch.setattr(aot, "compile_fn", lambda *a, **kw: pytest.fail("compiled"))
  for op in ("dlhs", "drhs"):
    rep, tile, tmem = peer.compile_peer("b200", "jax:blackwell_ragged_dot/collective", op, 512, 7168, 2048, 256, None)
    assert (rep.outcome, rep.error) == (
      aot.UNSUPPORTED,
      "jax's blackwell_ragged_dot_mgpu has the forward ragged_dot only",
    )
    assert (tile, tmem) == ("128x64x128, cell 256x256 (its test's)", "512")
