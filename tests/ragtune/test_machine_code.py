"""What ragtune.deviceless.machine_code reads from SASS text (cuobjdump -sass), on small hand-written
functions laid out as ptxas lays out Hopper kernels; and how aot turns those facts into a
compile outcome, a compile.jsonl row and a `ragtune compile` table line. No compiler runs
here: tests/ragtune/test_aot_compile.py reads real cubins."""

import dataclasses
import io
import json
import random
import struct

from rich.console import Console

import kernels
from ragtune.candidates import prune
from ragtune.cli import views
from ragtune.deviceless import aot, machine_code
from ragtune.problems.shapes import Problem
from ragtune.records import store

H100 = "NVIDIA H100 80GB HBM3"
PROBLEM = Problem("fwd", "mosaic_gpu", "bfloat16", 256, 128, 128, 2, "multinomial", (128, 128))


def _sass(name: str, *instrs: str) -> str:
  """cuobjdump -sass text of one function, one instruction per 16 bytes from 0x0."""
  lines = [f"\t\tFunction : {name}", '\t.headerflags\t@"EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"']
  lines += [
    f"        /*{16 * i:04x}*/                   {ins} ;   /* 0x000000000000794d */" for i, ins in enumerate(instrs)
  ]
  return "\n".join(lines) + "\n"


HGMMA_256 = "HGMMA.64x256x16.F32.BF16 R24, gdesc[UR8].tnspB, R24, gsb0"
HGMMA_128 = "HGMMA.64x128x16.F32.BF16 R88, gdesc[UR16].tnspB, R88"
WAIT_ONE = "WARPGROUP.DEPBAR.LE gsb0, 0x1"

# A k loop (0x30..0x80) whose accumulator is stored and reloaded around its wgmmas, after a
# prologue that spills once.
LOOP_SPILL = _sass(
  "k_loop_spill",
  "MOV R1, c[0x0][0x28]",  # 0x00
  "STL [R1+0x200], R2",  # 0x10: before any loop
  "WARPGROUP.ARRIVE",  # 0x20
  HGMMA_256,  # 0x30: loop head
  "STL.64 [R1], R24",  # 0x40
  "LDL.64 R24, [R1]",  # 0x50
  HGMMA_256,  # 0x60
  WAIT_ONE,  # 0x70
  "@P0 BRA 0x30",  # 0x80: back to the head
  "EXIT",  # 0x90
)


def test_spills_inside_the_wgmma_loop_are_counted_and_those_before_it_are_not():
  (f,) = machine_code.sass_facts(LOOP_SPILL).values()
  assert f.loop_spills == 2 and f.counts["STL"] == 2 and f.counts["LDL"] == 1
  assert f.loops_wait_one and f.hgmma_n == 256


def test_a_clean_loop_has_no_loop_spills_though_the_kernel_spills_elsewhere():
  sass = _sass(
    "k_clean",
    "STL [R1+0x200], R2",  # 0x00: before the loop
    HGMMA_128,  # 0x10: loop head
    HGMMA_128,
    WAIT_ONE,
    "@P0 BRA 0x10",  # 0x40
    "LDL R2, [R1+0x200]",  # 0x50: after it
    "EXIT",
  )
  (f,) = machine_code.sass_facts(sass).values()
  assert f.loop_spills == 0 and f.counts["STL"] == f.counts["LDL"] == 1


def test_out_of_line_waits_belong_to_the_loop_that_jumps_to_them_and_a_jump_back_alone_is_no_loop():
  """ptxas puts a loop's barrier retries after EXIT and jumps back into the loop: a spill
  there is in the loop. A retry of straight-line code (jump out, spin, jump back to the next
  instruction) makes no cycle through its target, so its spill is outside every loop, though
  it lies between an address and a branch back to it."""
  sass = _sass(
    "k_stubs",
    "@!P1 BRA 0x90",  # 0x00: a wait before the loop, out of line
    HGMMA_128,  # 0x10: loop head
    "@!P2 BRA 0xc0",  # 0x20: a wait in the loop, out of line
    WAIT_ONE,  # 0x30
    "@P0 BRA 0x10",  # 0x40: the loop's back edge
    "EXIT",  # 0x50
    "NOP",
    "NOP",
    "NOP",
    "STL [R1], R2",  # 0x90: the first wait: spills, spins, returns
    "@!P1 BRA 0x90",  # 0xa0
    "BRA 0x10",  # 0xb0: back to 0x10, which it does not dominate
    "LDL R2, [R1]",  # 0xc0: the loop's wait
    "@!P2 BRA 0xc0",  # 0xd0
    "BRA 0x30",  # 0xe0: back into the loop
  )
  (f,) = machine_code.sass_facts(sass).values()
  assert f.loop_spills == 1 and f.loops_wait_one


# sm_100 instructions as cuobjdump 13 prints them for ragtune's tcgen05 kernels (B200, cubins of
# `ragtune compile --target b200 --backend mosaic_blackwell`): the allocator, a CTA pair's MMA
# and commit, and the epilogue's tensor-memory load.
TMEM_ALLOC = "UTCATOMSWS.FIND_AND_SET.ALIGN UP0, UR4, UR4"
TMEM_ALLOC_PAIR = "UTCATOMSWS.2CTA.FIND_AND_SET.ALIGN UP0, UR4, UR4"
TMEM_RELINQUISH = "UTCATOMSWS.AND URZ, UR4"
UTCHMMA = "UTCHMMA gdesc[UR10], gdesc[UR18], tmem[UR46], tmem[UR44], idesc[UR45], UPT"
UTCHMMA_PAIR = "UTCHMMA.2CTA gdesc[UR10], gdesc[UR18], tmem[UR46], tmem[UR44], idesc[UR45], UP0"
UTCBAR_PAIR = "UTCBAR.2CTA.MULTICAST [UR17], URZ, UR48"
LDTM = "LDTM.16dp256bit.x8 R36, tmem[UR13]"


def _sm100(name: str, *instrs: str) -> str:
  return _sass(name, *instrs).replace("EF_CUDA_SM90", "EF_CUDA_SM100")


def test_tcgen05_kernels_show_their_mma_tensor_memory_and_cta_pair():
  """A 1-CTA kernel: tcgen05, tensor memory allocated, no pair; a pair's: tcgen05.2cta."""
  one = _sm100("one", TMEM_ALLOC, UTCHMMA, "UTCBAR [UR17], URZ", "@P0 BRA 0x10", LDTM, TMEM_RELINQUISH, "EXIT")
  pair = _sm100("pair", TMEM_ALLOC_PAIR, UTCHMMA_PAIR, UTCBAR_PAIR, "@P0 BRA 0x10", LDTM, "EXIT")
  no_alloc = _sm100("no_alloc", UTCHMMA, "@P0 BRA 0x0", TMEM_RELINQUISH, "EXIT")
  facts = machine_code.sass_facts(one + pair + no_alloc)
  kc = lambda name: machine_code.KernelCode(
    name=name, registers=90, local_bytes=0, stack_bytes=0, static_smem_bytes=1025, **vars(facts[name])
  )
  assert (kc("one").mma, kc("one").tmem_alloc, kc("one").cta_pair) == ("tcgen05", True, False)
  assert (kc("pair").mma, kc("pair").tmem_alloc, kc("pair").cta_pair) == ("tcgen05.2cta", True, True)
  assert facts["one"].counts == {"UTCATOMSWS": 2, "UTCHMMA": 1, "UTCBAR": 1, "LDTM": 1}
  # The relinquish (.AND) is not an allocation.
  assert (kc("no_alloc").mma, kc("no_alloc").tmem_alloc) == ("tcgen05", False)


def test_spills_in_a_tcgen05_loop_or_an_epilogue_loop_over_tmem_are_loop_spills():
  """The main loop of a tcgen05 kernel issues UTCHMMA; its epilogue's loop reads tensor
  memory (LDTM): local memory traffic in either is a loop spill. One before them is not."""
  sass = _sm100(
    "k_tc",
    "STL [R1+0x200], R2",  # 0x00: before any loop
    UTCHMMA,  # 0x10: the MMA loop's head
    "LDL R4, [R1]",  # 0x20
    "@P0 BRA 0x10",  # 0x30
    LDTM,  # 0x40: the epilogue loop's head
    "STL [R1+0x8], R36",  # 0x50
    "@P1 BRA 0x40",  # 0x60
    "EXIT",  # 0x70
  )
  (f,) = machine_code.sass_facts(sass).values()
  assert f.loop_spills == 2 and f.counts["STL"] == 2 and f.counts["LDL"] == 1


def test_fmas_between_a_wait_for_all_but_one_wgmma_and_a_wait_for_all_run_under_a_wgmma():
  loop = """
        Function : overlapped
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR8], RZ, !UPT ;
        /*0020*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R88, gdesc[UR16], RZ, !UPT, gsb0 ;
        /*0030*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0040*/                   FMUL R2, R2, R3 ;
        /*0050*/                   FFMA R150, R24, R2, R150 ;
        /*0060*/                   FFMA R151, R25, R2, R151 ;
        /*0070*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0080*/                   FFMA R152, R88, R2, R152 ;
        /*0090*/                   @P1 BRA 0x10 ;
        /*00a0*/                   FFMA R153, R88, R2, R153 ;
        /*00b0*/                   EXIT ;
"""
  serial = loop.replace("gsb0, 0x1", "gsb0, 0x0")
  facts, waits_all = machine_code.sass_facts(loop)["overlapped"], machine_code.sass_facts(serial)["overlapped"]
  assert facts.fma_under_wgmma == 2 and facts.loops_wait_one  # not the one after the wait for all, nor after the loop
  assert waits_all.fma_under_wgmma == 0 and not facts.serialized_wgmma


def test_wgmmas_that_each_close_a_group_of_their_own_are_serialized():
  """ptxas's C7514 (a non-wgmma instruction reading a running wgmma's accumulator): every
  wgmma carries gsb0 and is waited for on its own, though the wait may come far below it."""
  ffmas = "".join(
    f"        /*{0x100 + 16 * i:04x}*/                   FFMA R{150 + i}, R2, R3, R{150 + i} ;\n" for i in range(8)
  )
  sass = f"""
        Function : own_groups
        /*0000*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR8], RZ, !UPT, gsb0 ;
{ffmas}        /*0200*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0210*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR8], R24, gsb0 ;
{ffmas.replace("/*01", "/*03")}        /*0400*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0410*/                   EXIT ;
"""
  assert machine_code.sass_facts(sass)["own_groups"].serialized_wgmma
  one_group = sass.replace("RZ, !UPT, gsb0 ;", "RZ, !UPT ;")
  assert not machine_code.sass_facts(one_group)["own_groups"].serialized_wgmma
  # A pipeline of one wgmma a step: each its own group, all but the newest waited for.
  pipelined = sass.replace("gsb0, 0x0 ;", "gsb0, 0x1 ;", 1)
  assert not machine_code.sass_facts(pipelined)["own_groups"].serialized_wgmma


def test_setmaxnreg_and_the_widest_wgmma():
  ws = _sass(
    "k_ws",
    "USETMAXREG.DEALLOC.CTAPOOL 0x28",
    "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8",
    HGMMA_128,
    HGMMA_256,
    "EXIT",
  )
  plain = _sass("k_plain", HGMMA_128, "EXIT")
  no_mma = _sass("k_copy", "LDG.E R2, desc[UR4][R2.64]", "EXIT")
  facts = machine_code.sass_facts(ws + plain + no_mma)
  assert [(f.setmaxnreg, f.hgmma_n) for f in facts.values()] == [(True, 256), (False, 128), (False, 0)]
  assert list(facts) == ["k_ws", "k_plain", "k_copy"]


def _report(name: str, **kw) -> aot.KernelReport:
  base = dict(registers=168, spill_bytes=0, stack_bytes=0, smem_bytes=1 << 17, smem_source="config", mma="wgmma")
  base.update(copy="tma", counts={"HGMMA": 8}, serialized_wgmma=False, loops_wait_one=True)
  base.update(loop_spills=0, setmaxnreg=True, hgmma_n=256, threads=384, register_pool=64512, setmaxnreg_demand=64512)
  return aot.KernelReport(name, **{**base, **kw})


def test_a_loop_spill_is_the_worst_outcome_and_every_fault_is_named():
  clean = _report("ragtune_tgmm")
  serialized = _report("ragtune_gmm", serialized_wgmma=True)
  spill = _report("ragtune_gmm", spill_bytes=16, stack_bytes=16)
  looped = _report("ragtune_gmm", spill_bytes=1032, stack_bytes=1032, loop_spills=496, serialized_wgmma=True)
  assert aot.verdict((clean,)) == (aot.OK, "")
  assert aot.verdict((clean, serialized)) == (aot.SERIALIZED, "ragtune_gmm: wgmma serialized (ptxas C7511 or C7514)")
  assert aot.verdict((serialized, spill))[0] == aot.SPILL
  outcome, error = aot.verdict((spill, looped))
  assert outcome == aot.LOOP_SPILL
  assert error == "ragtune_gmm: 496 STL/LDL in its MMA loops (1032 B/thread); ragtune_gmm: 16 B/thread spilled"


def test_setmaxnreg_counts_and_the_worst_case_they_hold():
  """The counts each USETMAXREG sets, and what a CTA holds once its warpgroups have set them:
  tgmm's plan that hung on an H100 (a producer at 32, consumers at 240) against gmm's that
  runs (40 and 232), in a CTA of 3 warpgroups launched at 168 registers a thread."""
  ws = _sass(
    "k_ws",
    "USETMAXREG.DEALLOC.CTAPOOL 0x20",
    "@P0 BRA 0x40",
    "USETMAXREG.TRY_ALLOC.CTAPOOL UP1, 0xf0",
    "EXIT",
    "USETMAXREG.TRY_ALLOC.CTAPOOL UP1, 0xf0",
    "EXIT",
  )
  (f,) = machine_code.sass_facts(ws).values()
  assert (f.setmaxnreg, f.setmaxnreg_dec, f.setmaxnreg_inc) == (True, (32,), (240,))

  def code(dec, inc, threads=384):
    return machine_code.KernelCode(
      name="k",
      registers=168,
      local_bytes=0,
      stack_bytes=0,
      static_smem_bytes=0,
      threads=threads,
      setmaxnreg=bool(dec or inc),
      setmaxnreg_dec=dec,
      setmaxnreg_inc=inc,
    )

  hung = code((32,), (240,))
  assert (hung.setmaxnreg_demand, hung.register_pool) == (128 * (32 + 2 * 240), 384 * 168) == (65536, 64512)
  assert code((40,), (232,)).setmaxnreg_demand == code((24,), (240,)).setmaxnreg_demand == 64512
  assert code((40,), ()).setmaxnreg_demand == 128 * (40 + 2 * 168)  # the others keep their launch count
  assert code((), ()).setmaxnreg_demand is None and code((40,), (232,), threads=0).setmaxnreg_demand is None


def _kernel_code(sass: str, *, threads: int = 384, registers: int = 168) -> machine_code.KernelCode:
  """The KernelCode of one SASS function, as machine_code reads a cubin's."""
  (facts,) = machine_code.sass_facts(sass).values()
  return machine_code.KernelCode(
    name="k",
    registers=registers,
    local_bytes=0,
    stack_bytes=0,
    static_smem_bytes=0,
    threads=threads,
    **vars(facts),
  )


def _setmaxnreg_sass(*counts: str) -> str:
  """A warp-specialized kernel's USETMAXREGs ("dealloc 0x28", "alloc 0xf0"), each on its own
  path: one for the producer, one for each kind of consumer."""
  instrs = []
  for i, c in enumerate(counts):
    kind, imm = c.split()
    if i + 1 < len(counts):  # to the next path, past this one's three instructions
      instrs.append(f"@P{i} BRA {hex(16 * (len(instrs) + 3))}")
    alloc = "DEALLOC.CTAPOOL" if kind == "dealloc" else "TRY_ALLOC.CTAPOOL UP1,"
    instrs += [f"USETMAXREG.{alloc} {imm}", "EXIT"]
  return _sass("k", *instrs)


def test_setmaxnreg_demand_takes_the_largest_try_alloc_count():
  """Two consumer paths asking for 232 (0xe8) and 240 (0xf0) registers, a producer giving
  back to 40 (0x28), 3 warpgroups of 128 threads launched at 168 registers (a pool of 384 x
  168 = 64512). At worst both consumers take 240: 128 * (40 + 2 * 240) = 66560 > 64512, the
  last TRY_ALLOC waits forever. The smaller count would give 128 * (40 + 2 * 232) = 64512,
  which fits: the check must take the larger."""
  for order in (("dealloc 0x28", "alloc 0xe8", "alloc 0xf0"), ("alloc 0xf0", "dealloc 0x28", "alloc 0xe8")):
    kc = _kernel_code(_setmaxnreg_sass(*order))
    assert (kc.setmaxnreg, kc.setmaxnreg_dec, kc.setmaxnreg_inc) == (True, (40,), (232, 240)), order
    assert (kc.setmaxnreg_demand, kc.register_pool) == (66560, 64512), order
    report = _report("ragtune_mgpu_gmm", setmaxnreg_demand=kc.setmaxnreg_demand, register_pool=kc.register_pool)
    assert report.fault() == (
      aot.DEADLOCK,
      "ragtune_mgpu_gmm: setmaxnreg asks for 66560 registers of a CTA launched with 64512 (384 threads x 168): "
      "a warpgroup would wait for them forever",
    )


def test_setmaxnreg_demand_branches():
  """Each rule of KernelCode.setmaxnreg_demand on synthetic SASS, worked out by hand."""
  demand = lambda *counts, **kw: _kernel_code(_setmaxnreg_sass(*counts), **kw).setmaxnreg_demand
  # Two counts given back are two warpgroups'; the third takes 240: 128 * (24 + 40 + 240).
  assert demand("dealloc 0x18", "dealloc 0x28", "alloc 0xf0") == 128 * (24 + 40 + 240) == 38912
  # Only a DEALLOC: the other two warpgroups keep the launch count, 168.
  assert demand("dealloc 0x28") == 128 * (40 + 2 * 168) == 48128
  # Only TRY_ALLOCs: every warpgroup may take the largest, 240.
  assert demand("alloc 0xe8", "alloc 0xf0") == 128 * 3 * 240 == 92160
  # 320 threads are 3 warpgroups (setmaxnreg sets a whole warpgroup's count): 40 + 2 * 240.
  assert demand("dealloc 0x28", "alloc 0xe8", "alloc 0xf0", threads=320) == 128 * (40 + 2 * 240)
  # More counts given back than warpgroups: none left to take any.
  assert demand("dealloc 0x18", "dealloc 0x28", "alloc 0xf0", threads=128) == 128 * (24 + 40) == 8192
  # No thread count to place them in, or no setmaxnreg at all: nothing to check.
  assert demand("dealloc 0x28", "alloc 0xf0", threads=0) is None
  assert _kernel_code(_sass("k", HGMMA_128, "EXIT")).setmaxnreg_demand is None
  # A repeated count is one count.
  assert demand("dealloc 0x28", "alloc 0xf0", "alloc 0xf0") == 128 * (40 + 2 * 240)


def test_a_setmaxnreg_plan_over_the_pool_is_a_deadlock_and_the_worst_outcome(tmp_path):
  over = _report("ragtune_mgpu_tgmm", setmaxnreg_demand=65536)
  looped = _report("ragtune_mgpu_gmm", loop_spills=4, spill_bytes=8, stack_bytes=8)
  outcome, error = aot.verdict((looped, over, _report("ragtune_mgpu_gmm")))
  assert outcome == aot.DEADLOCK
  assert (
    "ragtune_mgpu_tgmm: setmaxnreg asks for 65536 registers of a CTA launched with 64512 (384 threads x 168)" in error
  )
  assert aot.verdict((_report("k", threads=0, register_pool=0, setmaxnreg_demand=None),))[0] == aot.DEADLOCK
  assert aot.verdict((_report("k", setmaxnreg=False, threads=256, setmaxnreg_demand=None),)) == (aot.OK, "")
  # prune drops it from a sweep
  cfg = kernels.MosaicConfig(128, 128, 64, 4, 1)
  row = {"id": f"{prune.shape_key(H100, PROBLEM)}|{store.candidate_id(cfg)}", "candidate": store.candidate_id(cfg)}
  (tmp_path / prune.COMPILE_RECORDS).write_text(json.dumps(row | {"outcome": outcome, "error": error}) + "\n")
  assert (
    "register_deadlock: ragtune_mgpu_tgmm" in prune.rejected(tmp_path, H100, PROBLEM)[store.candidate_id(cfg)].reason
  )


def test_a_loop_spill_row_is_rejected_for_the_sweep(tmp_path):
  cfg, clean = kernels.MosaicConfig(128, 128, 64, 4, 1), kernels.MosaicConfig(128, 128, 64, 3, 1)
  looped = _report("ragtune_gmm", loop_spills=4, spill_bytes=8, stack_bytes=8)
  for c, kr in ((cfg, looped), (clean, _report("ragtune_gmm"))):
    outcome, error = aot.verdict((kr,))
    row = {"id": f"{prune.shape_key(H100, PROBLEM)}|{store.candidate_id(c)}", "candidate": store.candidate_id(c)}
    row |= {"outcome": outcome, "error": error, "kernels": [kr.to_dict()]}
    with open(tmp_path / prune.COMPILE_RECORDS, "a") as f:
      f.write(json.dumps(row) + "\n")
  rejected = prune.rejected(tmp_path, H100, PROBLEM)
  assert list(rejected) == [store.candidate_id(cfg)]
  assert "loop_spill: ragtune_gmm: 4 STL/LDL in its MMA loops" in rejected[store.candidate_id(cfg)].reason


def test_the_compile_table_shows_loop_spills_hgmma_n_and_setmaxnreg():
  cfg = kernels.MosaicConfig(128, 128, 64, 4, 1)
  kr = _report("ragtune_gmm", loop_spills=496, hgmma_n=192, setmaxnreg=False)
  rep = {"outcome": aot.LOOP_SPILL, "error": "x", "compile_s": 1.0, "kernels": [dataclasses.asdict(kr)]}
  out = io.StringIO()
  Console(file=out, width=250).print(views.compile_table(H100, [(PROBLEM, cfg)], {0: rep}, aot.OK))
  header, row = [l.replace("┃", "│").split("│") for l in out.getvalue().splitlines() if "┃" in l or "│" in l]
  cells = dict(zip([c.strip() for c in header], [c.strip() for c in row]))
  assert (cells["loop spills"], cells["HGMMA n"], cells["setmaxnreg"]) == ("496", "192", "no"), cells


def _varint(n: int) -> bytes:
  out = bytearray()
  while n >= 0x80:
    out.append(n & 0x7F | 0x80)
    n >>= 7
  return bytes(out + bytes([n]))


def _chunk(kind: str, *records: bytes, snappy: bool = False) -> bytes:
  """A Riegeli chunk: a 40-byte header (hashes left 0: the reader does not check them), then
  for a simple chunk ('r') the compression type, the record sizes and the values, each
  buffer snappy-compressed after its decompressed size if `snappy`."""
  body = b""
  if kind == "r":
    sizes, values = b"".join(_varint(len(r)) for r in records), b"".join(records)
    if snappy:
      import cramjam

      sizes, values = (_varint(len(b)) + bytes(cramjam.snappy.compress_raw(b)) for b in (sizes, values))
    body = (b"s" if snappy else b"\x00") + _varint(len(sizes)) + sizes + values
  count = len(records) if kind == "r" else 0
  chunk = struct.pack("<QQQQQ", 0, len(body), 0, ord(kind) | count << 8, sum(map(len, records))) + body
  return chunk + bytes(max(0, count - len(chunk)))  # padding: a chunk spans at least a byte a record


def _stream(*chunks: bytes) -> bytes:
  """A Riegeli stream of the signature and `chunks`, with a block header every 64 KiB (the
  first one's hash the magic; the rest, unread, zeros). No chunk here ends right after a
  block header, where the format would pad it."""
  flat = _chunk("s") + b"".join(chunks)
  usable = machine_code._RIEGELI_BLOCK - machine_code._RIEGELI_BLOCK_HEADER
  blocks = [flat[i : i + usable] for i in range(0, len(flat), usable)]
  head = machine_code._RIEGELI_MAGIC + bytes(machine_code._RIEGELI_BLOCK_HEADER - 8)
  return head + b"".join(bytes(machine_code._RIEGELI_BLOCK_HEADER) * (i > 0) + b for i, b in enumerate(blocks))


def _elf(payload: bytes, machine: int = 190) -> bytes:
  """A 64-bit ELF image (EM_CUDA: 190) of two sections, .shstrtab and .text holding
  `payload`, whose data lies after the section header table (ptxas puts the tables last)."""
  names = b"\0.shstrtab\0.text\0"
  shoff = 64 + len(names)
  text = shoff + 3 * 64
  header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
  header += struct.pack("<HHIQQQIHHHHHH", 2, machine, 1, 0, 0, shoff, 0, 64, 56, 0, 64, 3, 1)
  section = lambda name, kind, offset, size: struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, offset, size, 0, 0, 1, 0)
  table = bytes(64) + section(1, 3, 64, len(names)) + section(11, 1, text, len(payload))
  return header + names + table + payload


def test_every_record_chunk_is_read_up_to_the_outer_tail():
  """A large executable's stream holds a small record chunk and then the one with the
  cubins; the bytes after the stream belong to the outer proto and end it."""
  tail = b"\x12\x03abc" + bytes(64)  # no chunk type, and a size past the data
  stream = _stream(_chunk("r", b"header"), _chunk("p"), _chunk("r", b"\x7fELF...")) + tail
  assert machine_code.riegeli_records(stream) == [b"header", b"\x7fELF..."]


def test_snappy_chunks_are_split_into_their_records_and_padding_is_skipped():
  records = [b"xla.gpu.GpuExecutableProto", bytes(70_000), b"", b"abc" * 1000]
  empty = [b""] * 1000  # far more records than bytes: the chunk is padded
  stream = _stream(_chunk("r", *records, snappy=True), _chunk("r", *empty, snappy=True), _chunk("r", b"last"))
  assert machine_code.riegeli_records(stream) == [*records, *empty, b"last"]


def test_the_cubins_of_a_stream_nested_in_a_record_are_found():
  """jaxlib 0.12's layout: the GpuExecutableProto's snappy stream is a record of the outer
  stream, which a pickle holds. Both streams cross a 64 KiB block header; only whole CUDA
  ELF images are cubins: not a stray magic, an x86-64 image nor a truncated one."""
  big, small = _elf(random.Random(0).randbytes(100_000)), _elf(b"SASS")  # big: what snappy cannot shrink
  gpu_proto = b"\x0a\x1axla.gpu.GpuExecutableProto\x7fELF" + big + b"\x12" + _elf(b"x86", machine=62) + small
  gpu_proto += _elf(b"cut off")[:-3]
  inner = _stream(_chunk("r", b"head", gpu_proto, snappy=True))
  outer = _stream(_chunk("r", b"xla.ExecutableAndOptionsProto"), _chunk("r", inner, b"options"))
  assert len(inner) > machine_code._RIEGELI_BLOCK and len(outer) > machine_code._RIEGELI_BLOCK
  assert machine_code.cubins(b"\x80\x04pickle" + outer + b"\x1a\x02tail") == [big, small]
  assert machine_code._cuda_elf_size(big + b"more") == len(big)
