"""What a compiled GPU program's kernels are made of, read from their machine code.

A jax executable compiled for CUDA serializes (``Executable.serialize()``) to a protobuf
that holds a Riegeli record stream (jaxlib 0.12 nests it in a record of a second one); its
record is XLA's GpuExecutableProto, where every kernel's cubin is an ELF image. We cut the
cubins out of the record, then let NVIDIA's ``cuobjdump`` say what they use: ``-res-usage``
gives registers, STACK and LOCAL bytes (spills land in LOCAL) and static shared memory;
``-sass`` gives the instructions.

Riegeli's format: github.com/google/riegeli, doc/riegeli_records_file_format.md; simple
chunks are read (XLA writes them snappy-compressed). cramjam decompresses them and
pyelftools reads the ELF headers (both in the gpu-compile extra).
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import io
import os
import re
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

from kernels.common import WARPGROUP
from ragtune.errors import install_hint
from ragtune.provenance import find_tool

_RIEGELI_BLOCK = 1 << 16
_RIEGELI_BLOCK_HEADER = 24
_RIEGELI_CHUNK_HEADER = 40
# The first 8 bytes of every Riegeli file: the hash of its first block header.
_RIEGELI_MAGIC = bytes.fromhex("83af70d10d884a3f")
_ELF_MAGIC = b"\x7fELF"

# Instructions that say how a kernel computes and moves data (SASS names, as cuobjdump 13
# prints them). HGMMA: Hopper's wgmma on 16-bit inputs (QGMMA on fp8, IGMMA on int8); HMMA:
# mma.sync on 16-bit inputs (QMMA on fp8, sm_89 and sm_120; IMMA on int8). Blackwell (sm_100):
# UTCHMMA is tcgen05.mma on 16-bit inputs (UTCQMMA on 8-bit floats, kind::f8f6f4; UTCIMMA on
# int8) (UTCHMMA.2CTA: cta_group::2, a CTA pair's MMA), UTCBAR tcgen05.commit, LDTM/STTM tcgen05.ld/st (tensor
# memory to and from registers), UTCATOMSWS tensor memory's allocator (.FIND_AND_SET:
# tcgen05.alloc). UTMALDG/UTMASTG: TMA loads/stores; LDGSTS: cp.async; STL/LDL: local memory
# (spills) traffic; USETMAXREG: setmaxnreg, warp specialization's move of registers between
# warpgroups.
INSTRUCTIONS = (
  "HGMMA",
  "QGMMA",
  "IGMMA",
  "UTCHMMA",
  "UTCQMMA",
  "UTCIMMA",
  "HMMA",
  "QMMA",
  "IMMA",
  "UTCBAR",
  "LDTM",
  "STTM",
  "UTCATOMSWS",
  "UTMALDG",
  "UTMASTG",
  "LDGSTS",
  "LDSM",
  "STL",
  "LDL",
  "USETMAXREG",
)
WGMMA_OPS = ("HGMMA", "QGMMA", "IGMMA")  # wgmma, by input width
TCGEN05_OPS = ("UTCHMMA", "UTCQMMA", "UTCIMMA")  # tcgen05.mma, by input width
_MMA_OPS = (*WGMMA_OPS, *TCGEN05_OPS)  # the asynchronous MMAs whose loops are the main loops
MMA_SYNC_OPS = ("HMMA", "QMMA", "IMMA")  # mma.sync, by input width
# The inputs an MMA takes when its modifiers name none: HMMA's and HGMMA's SASS default, f16;
# a tcgen05 MMA's class, from its opcode (its descriptor names the exact type).
_UNNAMED_INPUTS = {"HMMA": "f16", "HGMMA": "f16", "UTCQMMA": "f8f6f4", "UTCIMMA": "i8", "IMMA": "i8"}


class MachineCodeError(RuntimeError):
  """The executable could not be read, or cuobjdump is missing."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SassFacts:
  """What one function's SASS (``cuobjdump -sass``) says.

  counts: how many of each INSTRUCTIONS name the SASS holds.
  serialized_wgmma: most wgmmas are waited for at once (an HGMMA followed within three
  instructions by ``WARPGROUP.DEPBAR.LE gsb0, 0x0``), or every one closes a group of its own
  (``gsb0`` on each) that is waited for before the next: ptxas's C7511 "serialized due to
  insufficient register resources" or C7514 (a non-wgmma instruction reading a running
  wgmma's accumulator), several times slower, though it compiles.
  loops_wait_one: every loop that issues wgmma waits with ``DEPBAR.LE gsb0, 0x1`` in it
  (one wgmma left in flight), as a pipeline that releases a step's buffers after the next
  step's wgmma is issued must.
  loop_spills: STL/LDL instructions inside the loops that issue wgmma or tcgen05 MMAs or
  read tensor memory: the accumulator (or what lives beside it) stored and reloaded at
  every step, not once per kernel.
  setmaxnreg: the SASS moves registers between warpgroups (USETMAXREG), as a
  warp-specialized kernel does to give its consumers more than its producer.
  hgmma_n: the widest wgmma's N (``HGMMA.64x256x16.F32.BF16``: 256); 0 without wgmma.
  tmem_alloc: the kernel allocates tensor memory (UTCATOMSWS.FIND_AND_SET, tcgen05.alloc).
  cta_pair: its tcgen05 MMAs are a CTA pair's (UTCHMMA.2CTA, cta_group::2).
  mma_inputs: the MMAs' input types as the SASS names them (``HMMA.16832.F32.E4M3.E4M3``:
  "e4m3"; ``HGMMA.64x256x16.F32.BF16``: "bf16"), several joined by "+"; "" without MMAs.
  setmaxnreg_dec, setmaxnreg_inc: the distinct counts its setmaxnreg instructions set, those
  that give registers back to the CTA's pool (``USETMAXREG.DEALLOC``) and those that take
  them (``USETMAXREG.TRY_ALLOC``, which retries until the pool has them).
  fma_under_wgmma: FFMAs in the wgmma loops between a ``WARPGROUP.DEPBAR.LE gsb0, 0x1`` and
  the next wait for all (in address order): FMAs issued while a wgmma may still run, as
  fp8 block128's promotion of one k block under the next block's wgmma; 0 when every FMA
  waits for every wgmma.
  """

  counts: dict[str, int] = dataclasses.field(default_factory=dict)
  serialized_wgmma: bool = False
  loops_wait_one: bool = False
  loop_spills: int = 0
  setmaxnreg: bool = False
  hgmma_n: int = 0
  tmem_alloc: bool = False
  cta_pair: bool = False
  mma_inputs: str = ""
  setmaxnreg_dec: tuple[int, ...] = ()
  setmaxnreg_inc: tuple[int, ...] = ()
  fma_under_wgmma: int = 0


# The input types an MMA's modifiers name (F32 is the accumulator's; F16 may be either).
_MMA_INPUT_TYPES = ("E4M3", "E5M2", "BF16", "F16", "TF32", "S8", "U8")


def _mma_inputs(mma: list[tuple[str, str]]) -> str:
  """The input types of (op, modifiers) MMAs. An HMMA or HGMMA that names none takes f16, the
  SASS's default (``HMMA.16816.F32``: f16 x f16 -> f32); a tcgen05 MMA's are in its
  descriptor, and its opcode says the class (UTCQMMA: "f8f6f4"; UTCHMMA: none named)."""
  found = set()
  for op, mods in mma:
    kinds = {t.lower() for t in mods.split(".") if t in _MMA_INPUT_TYPES}
    found |= kinds or ({_UNNAMED_INPUTS[op]} if op in _UNNAMED_INPUTS else set())
  return "+".join(sorted(found))


@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelCode(SassFacts):
  """One kernel of a compiled program, as its cubin says: its SASS facts, and

  registers: per thread. spill_bytes: per-thread bytes of register spills, which ptxas
  puts in the stack frame (STACK) or local memory (LOCAL); 0 means none. stack_bytes,
  local_bytes: the two figures as cuobjdump gives them. static_smem_bytes: shared memory
  declared in the cubin (dynamic shared memory is set at launch, see aot.KernelReport).
  threads: the CTA's threads as the cubin declares them (.maxntid or .reqntid); 0 if it
  declares none.
  """

  name: str
  registers: int
  local_bytes: int
  stack_bytes: int
  static_smem_bytes: int
  threads: int = 0

  @property
  def register_pool(self) -> int:
    """Registers the CTA is launched with, all its threads': what setmaxnreg shares out."""
    return self.registers * self.threads

  @property
  def setmaxnreg_demand(self) -> int | None:
    """Registers the CTA holds once every warpgroup has set its count, in the worst case the
    SASS allows: each count it gives back (DEALLOC) is one warpgroup's, and every other
    warpgroup takes the largest count asked for (TRY_ALLOC), or keeps its launch count if
    none is. None without setmaxnreg, or with no thread count to place it in; over
    register_pool, the last warpgroup's TRY_ALLOC never succeeds: the kernel hangs."""
    if not (self.setmaxnreg_dec or self.setmaxnreg_inc) or not self.threads:
      return None
    warpgroups = -(-self.threads // WARPGROUP)  # setmaxnreg sets a whole warpgroup's count
    rest = max(0, warpgroups - len(self.setmaxnreg_dec))
    taken = max(self.setmaxnreg_inc, default=self.registers)
    return WARPGROUP * (sum(self.setmaxnreg_dec) + rest * taken)

  @property
  def spill_bytes(self) -> int:
    # None of our kernels calls a function or takes an address of a local, so any stack
    # frame is spill space; STL/LDL are its stores and loads.
    return max(self.stack_bytes, self.local_bytes)

  @property
  def mma(self) -> str:
    for op, kind in (
      *((op, "wgmma") for op in WGMMA_OPS),
      *((op, "tcgen05.2cta" if self.cta_pair else "tcgen05") for op in TCGEN05_OPS),
      *((op, "mma.sync") for op in MMA_SYNC_OPS),
    ):
      if self.counts.get(op):
        return kind
    return "none"

  @property
  def copy(self) -> str:
    if self.counts.get("UTMALDG"):
      return "tma"
    return "cp.async" if self.counts.get("LDGSTS") else "ld/st"


# --- the cubins inside a serialized executable ------------------------------------------


def _varint(b: bytes, pos: int) -> tuple[int, int]:
  n = shift = 0
  while True:
    if pos >= len(b):
      raise MachineCodeError("a varint runs past the end of its buffer")
    x = b[pos]
    pos += 1
    n |= (x & 0x7F) << shift
    shift += 7
    if x < 0x80:
      return n, pos


def _read(stream: bytes, pos: int, size: int) -> bytes:
  """`size` bytes of a Riegeli stream from position `pos` on, less the block headers at
  every 64 KiB that interrupt them."""
  out = bytearray()
  while len(out) < size:
    pos = max(pos, pos - pos % _RIEGELI_BLOCK + _RIEGELI_BLOCK_HEADER)
    take = min(size - len(out), _RIEGELI_BLOCK - pos % _RIEGELI_BLOCK)
    if pos + take > len(stream):
      raise MachineCodeError("the Riegeli stream ends inside a chunk")
    out += stream[pos : pos + take]
    pos += take
  return bytes(out)


def _chunk_end(begin: int, data_size: int, num_records: int) -> int:
  """Where the next chunk begins: the format doc's `chunk_end` (its implementation notes),
  block headers and padding included."""
  usable = _RIEGELI_BLOCK - _RIEGELI_BLOCK_HEADER
  size = _RIEGELI_CHUNK_HEADER + data_size
  with_overhead = begin + size + (size + (begin + usable - 1) % _RIEGELI_BLOCK) // usable * _RIEGELI_BLOCK_HEADER
  records_end = begin + num_records
  return max(with_overhead, records_end + max(0, -records_end % _RIEGELI_BLOCK - (usable - 1)))


def _decompress(compression: int, block: bytes) -> bytes:
  """A compressed buffer of a simple chunk: after a varint of its decompressed size, raw
  snappy ('s', what XLA writes), zstd ('z') or brotli ('b')."""
  if compression == 0:
    return block
  import cramjam

  codec = {
    ord("s"): cramjam.snappy.decompress_raw,
    ord("z"): cramjam.zstd.decompress,
    ord("b"): cramjam.brotli.decompress,
  }
  if compression not in codec:
    raise MachineCodeError(f"unknown Riegeli compression type {compression:#x}")
  size, pos = _varint(block, 0)
  try:
    out = bytes(codec[compression](block[pos:]))
  except cramjam.DecompressionError as e:
    raise MachineCodeError(f"corrupt Riegeli chunk: {e}") from None
  if len(out) != size:
    raise MachineCodeError(f"a Riegeli buffer decoded to {len(out)} bytes, expected {size}")
  return out


def _simple_chunk(data: bytes, num_records: int, decoded_size: int) -> list[bytes]:
  """The records of a simple chunk: compression type, the size of the compressed record
  sizes, the record sizes (varints), the concatenated values."""
  sizes_len, pos = _varint(data, 1)
  sizes = _decompress(data[0], data[pos : pos + sizes_len])
  values = _decompress(data[0], data[pos + sizes_len :])
  if len(values) != decoded_size:
    raise MachineCodeError("Riegeli chunk size mismatch")
  records, start, at = [], 0, 0
  for _ in range(num_records):
    length, at = _varint(sizes, at)
    records.append(values[start : start + length])
    start += length
  if start != decoded_size:
    raise MachineCodeError("Riegeli record sizes do not add up to the chunk's values")
  return records


def riegeli_records(stream: bytes) -> list[bytes]:
  """The records of the Riegeli stream that `stream` starts with.

  Chunks follow one another from the start, each a 40-byte header and its data; a 24-byte
  block header interrupts them at every 64 KiB. Only simple chunks ('r') hold records here:
  the signature ('s'), metadata ('m') and padding ('p') are skipped. `stream` may run on
  past the stream's end into the proto that holds it, which no header bounds: the stream
  ends at the first header that is no chunk (an unknown type, data past the bytes), or,
  once records were read, at a chunk that does not decode."""
  out, pos = [], 0
  while pos < len(stream):
    try:
      header = _read(stream, pos, _RIEGELI_CHUNK_HEADER)
    except MachineCodeError:
      break
    _, data_size, _, type_and_count, decoded_size = struct.unpack("<QQQQQ", header)
    kind, num_records = chr(type_and_count & 0xFF), type_and_count >> 8
    end = _chunk_end(pos, data_size, num_records)
    if kind not in "rspm" or end > len(stream):
      break
    if kind == "r":
      try:
        out += _simple_chunk(
          _read(stream, pos, _RIEGELI_CHUNK_HEADER + data_size)[_RIEGELI_CHUNK_HEADER:], num_records, decoded_size
        )
      except MachineCodeError:
        if not out:
          raise
        break
    pos = end
  if not out:
    raise MachineCodeError("no record chunk in the Riegeli stream")
  return out


def _leaf_records(data: bytes) -> list[bytes]:
  """The records of the Riegeli stream in `data`, each record that holds a stream itself
  replaced by that stream's records: jaxlib 0.12 wraps the GpuExecutableProto's stream in a
  record of the executable's own, where jaxlib 0.10 has it at the top."""
  start = data.find(_RIEGELI_MAGIC)
  if start < 0:
    raise MachineCodeError("no Riegeli stream in the executable (not a GPU executable?)")
  leaves = []
  for record in riegeli_records(data[start:]):
    leaves += _leaf_records(record) if _RIEGELI_MAGIC in record else [record]
  return leaves


def _cuda_elf_size(data: bytes) -> int:
  """The size of the CUDA ELF image that `data` starts with (its headers, tables and
  sections all inside `data`); 0 if it starts with none."""
  from elftools.common.exceptions import ELFError
  from elftools.elf.elffile import ELFFile

  try:
    elf = ELFFile(io.BytesIO(data))
    if elf["e_machine"] != "EM_CUDA":
      return 0
    ends = [
      elf["e_shoff"] + elf.num_sections() * elf["e_shentsize"],
      elf["e_phoff"] + elf.num_segments() * elf["e_phentsize"],
      *(s["sh_offset"] + s["sh_size"] for s in elf.iter_sections() if s["sh_type"] != "SHT_NOBITS"),
      *(seg["p_offset"] + seg["p_filesz"] for seg in elf.iter_segments()),
    ]
  except (ELFError, OverflowError):  # bytes that only start like an ELF header
    return 0
  return max(ends) if max(ends) <= len(data) else 0


def cubins(serialized: bytes) -> list[bytes]:
  """The CUDA ELF images in a serialized jax GPU executable, found by their magic bytes in
  every record (XLA keeps each one whole in a bytes field of the GpuExecutableProto)."""
  found = []
  for record in _leaf_records(serialized):
    pos = record.find(_ELF_MAGIC)
    while pos >= 0:
      size = _cuda_elf_size(record[pos:])
      if size:
        found.append(record[pos : pos + size])
      pos = record.find(_ELF_MAGIC, pos + (size or 1))
  return found


# --- cuobjdump --------------------------------------------------------------------------


def _run(tool: str, *args: str) -> str:
  env = dict(os.environ)
  env["PATH"] = os.pathsep.join([str(Path(tool).parent), env.get("PATH", "")])  # cuobjdump -sass runs nvdisasm
  r = subprocess.run([tool, *args], capture_output=True, text=True, env=env, timeout=300)
  if r.returncode != 0:
    raise MachineCodeError(f"{Path(tool).name} {' '.join(args[:-1])}: {r.stderr.strip()[-400:]}")
  return r.stdout


_RES = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
_FUNC = re.compile(r"^\s*Function : (\S+)", re.M)
_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Za-z0-9_]+)*)\s*([^;]*);")
_JUMPS = ("BRA", "JMP")  # to an address in their operand
_ENDS = ("EXIT", "RET", "BRX", "JMX")  # no fall-through, and no successor we can name
_HGMMA_SHAPE = re.compile(r"^\.(\d+)x(\d+)x(\d+)")
_IMMEDIATE = re.compile(r"0x([0-9a-f]+)\s*$")


class _Instr(NamedTuple):
  addr: int
  op: str
  mods: str
  args: str
  predicated: bool


def _instructions(body: str) -> list[_Instr]:
  out = []
  for line in body.splitlines():
    m = _INSTR.search(line)
    if m:
      out.append(_Instr(int(m.group(1), 16), m.group(3), m.group(4), m.group(5), m.group(2) is not None))
  return out


def _natural_loops(instrs: list[_Instr]) -> list[set[int]]:
  """Each loop's instructions (indices into instrs), one per back edge: a jump to a block
  that dominates the jump. A loop holds the code ptxas lays out after it and jumps back
  from (its out-of-line barrier waits); such a jump back alone, with no cycle through its
  target, is no loop."""
  at = {ins.addr: i for i, ins in enumerate(instrs)}

  def target(ins: _Instr) -> int | None:
    t = re.match(r"\s*0x([0-9a-f]+)", ins.args)
    return at.get(int(t.group(1), 16)) if ins.op in _JUMPS and t else None

  starts = {0} | {t for ins in instrs if (t := target(ins)) is not None}
  starts |= {i + 1 for i, ins in enumerate(instrs) if ins.op in _JUMPS + _ENDS and i + 1 < len(instrs)}
  starts_sorted = sorted(starts)
  blocks = [range(a, b) for a, b in zip(starts_sorted, [*starts_sorted[1:], len(instrs)])]
  block_of = {s: b for b, s in enumerate(starts_sorted)}
  succ: list[list[int]] = []
  for b, rng in enumerate(blocks):
    last = instrs[rng[-1]]
    nxt = [block_of[t]] if (t := target(last)) is not None else []
    if (last.predicated or last.op not in _JUMPS + _ENDS) and b + 1 < len(blocks):
      nxt.append(b + 1)
    succ.append(nxt)
  reached, stack = {0}, [0]
  while stack:
    for s in succ[stack.pop()]:
      if s not in reached:
        reached.add(s)
        stack.append(s)
  preds: dict[int, list[int]] = {b: [] for b in reached}
  for b in reached:
    for s in succ[b]:
      preds[s].append(b)
  dom = {b: set(reached) for b in reached}
  dom[0] = {0}
  changed = True
  while changed:
    changed = False
    for b in sorted(reached - {0}):
      new = {b} | set.intersection(*(dom[p] for p in preds[b]))
      if new != dom[b]:
        dom[b], changed = new, True
  loops = []
  for u in sorted(reached):
    for head in succ[u]:
      if head in dom[u]:  # u -> head closes a loop: head and what reaches u without passing it
        body, stack = {head, u}, [u] if u != head else []
        while stack:
          for p in preds[stack.pop()]:
            if p not in body:
              body.add(p)
              stack.append(p)
        loops.append({i for b in body for i in blocks[b]})
  return loops


def sass_facts(sass: str) -> dict[str, SassFacts]:
  """Per function of ``cuobjdump -sass`` text: what SassFacts says of it."""
  facts = {}
  parts = _FUNC.split(sass)
  for name, body in zip(parts[1::2], parts[2::2]):
    instrs = _instructions(body)
    counts = collections.Counter(ins.op for ins in instrs if ins.op in INSTRUCTIONS)
    hgmma = [i for i, ins in enumerate(instrs) if ins.op in WGMMA_OPS]

    def is_wait(i, level):
      ins = instrs[i]
      return (
        ins.op == "WARPGROUP"
        and ".DEPBAR" in ins.mods
        and "gsb0" in ins.args
        and ins.args.rstrip().endswith(hex(level))
      )

    # C7511 or C7514: ptxas waits for (nearly) every wgmma right after issuing it, or makes
    # each one its own group (gsb0 on every one) and waits for it before the next one, the
    # wait maybe far below. A pipelined kernel issues a step's wgmmas back to back as one
    # group and waits once a step (a group of one wgmma waits for all but the newest).
    waited = sum(any(is_wait(j, 0) for j in range(i + 1, min(i + 4, len(instrs)))) for i in hgmma)
    own_group = len(hgmma) > 1 and all("gsb0" in instrs[i].args for i in hgmma)
    own_group = own_group and all(any(is_wait(j, 0) for j in range(i + 1, i2)) for i, i2 in zip(hgmma, hgmma[1:]))
    loops = _natural_loops(instrs)
    wgmma_loops = [body for body in loops if any(instrs[j].op in WGMMA_OPS for j in body)]
    main_loops = [body for body in loops if any(instrs[j].op in (*_MMA_OPS, "LDTM") for j in body)]
    in_main_loops = set().union(*main_loops)
    in_wgmma_loops, under, running = set().union(*wgmma_loops), 0, False
    for j in sorted(in_wgmma_loops):  # a loop nested in another is counted once
      running = (running or is_wait(j, 1)) and not is_wait(j, 0)
      under += running and instrs[j].op == "FFMA"
    shapes = [_HGMMA_SHAPE.match(instrs[i].mods) for i in hgmma]
    facts[name] = SassFacts(
      counts=dict(counts),
      serialized_wgmma=bool(hgmma) and (waited * 2 > len(hgmma) or own_group),
      loops_wait_one=bool(wgmma_loops) and all(any(is_wait(j, 1) for j in body) for body in wgmma_loops),
      loop_spills=sum(instrs[j].op in ("STL", "LDL") for j in in_main_loops),
      setmaxnreg=bool(counts.get("USETMAXREG")),
      hgmma_n=max((int(s.group(2)) for s in shapes if s), default=0),
      tmem_alloc=any(ins.op == "UTCATOMSWS" and ".FIND_AND_SET" in ins.mods for ins in instrs),
      cta_pair=any(ins.op in TCGEN05_OPS and ".2CTA" in ins.mods for ins in instrs),
      mma_inputs=_mma_inputs([(ins.op, ins.mods) for ins in instrs if ins.op in (*_MMA_OPS, *MMA_SYNC_OPS)]),
      setmaxnreg_dec=_setmaxnreg_counts(instrs, dealloc=True),
      setmaxnreg_inc=_setmaxnreg_counts(instrs, dealloc=False),
      fma_under_wgmma=under,
    )
  return facts


def _setmaxnreg_counts(instrs: list[_Instr], *, dealloc: bool) -> tuple[int, ...]:
  """The distinct register counts of the USETMAXREG instructions that give registers back
  (dealloc) or take them: ``USETMAXREG.DEALLOC.CTAPOOL 0x28`` sets 40."""
  found = set()
  for ins in instrs:
    if ins.op == "USETMAXREG" and (".DEALLOC" in ins.mods) == dealloc:
      imm = _IMMEDIATE.search(ins.args)
      if imm is None:
        raise MachineCodeError(f"USETMAXREG{ins.mods} {ins.args.strip()}: no register count")
      found.add(int(imm.group(1), 16))
  return tuple(sorted(found))


# EIATTR_MAX_THREADS (.maxntid) and EIATTR_REQNTID (.reqntid): a function's CTA shape in its
# .nv.info.<name> section, as cuobjdump -elf names them; each attribute is a format byte, an id
# byte, and for EIFMT_SVAL a 16-bit size and its value (three 32-bit dims here), else 2 bytes.
_EIATTR_THREADS = (0x05, 0x10)
_EIFMT_SVAL = 4


def cta_threads(cubin: bytes) -> dict[str, int]:
  """Function name -> threads of its CTA, from the cubin's .nv.info.<name> sections."""
  from elftools.elf.elffile import ELFFile

  out = {}
  for sec in ELFFile(io.BytesIO(cubin)).iter_sections():
    if not sec.name.startswith(".nv.info."):
      continue
    data, pos, dims = sec.data(), 0, {}
    while pos + 4 <= len(data):
      fmt, attr = data[pos], data[pos + 1]
      size = struct.unpack_from("<H", data, pos + 2)[0] if fmt == _EIFMT_SVAL else 0
      if attr in _EIATTR_THREADS and fmt == _EIFMT_SVAL and size == 12:
        dims[attr] = struct.unpack_from("<3I", data, pos + 4)
      pos += 4 + size
    for attr in _EIATTR_THREADS:
      if attr in dims:
        x, y, z = dims[attr]
        out[sec.name[len(".nv.info.") :]] = x * y * z
        break
  return out


def read_cubin(cubin: bytes, cuobjdump: str) -> list[KernelCode]:
  """Every function of one cubin, by cuobjdump."""
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "k.cubin")
    with open(path, "wb") as f:
      f.write(cubin)
    res = _run(cuobjdump, "-res-usage", path)
    sass = _run(cuobjdump, "-sass", path)
  facts = sass_facts(sass)
  threads = cta_threads(cubin)
  return [
    KernelCode(
      name=name,
      registers=int(reg),
      local_bytes=int(local),
      stack_bytes=int(stack),
      static_smem_bytes=int(shared),
      threads=threads.get(name, 0),
      **vars(facts.get(name, SassFacts())),
    )
    for name, reg, stack, shared, local in _RES.findall(res)
  ]


def read_executable(serialized: bytes, cuobjdump: str | None = None, only: bytes | None = None) -> list[KernelCode]:
  """Every kernel in a serialized jax GPU executable (``Executable.serialize()``); with
  `only`, just the cubins whose bytes contain it (a kernel name: cuobjdump costs ~0.3 s a
  call, and XLA's own fusions come one cubin each)."""
  cuobjdump = cuobjdump or find_tool("cuobjdump")
  if cuobjdump is None:
    raise MachineCodeError(
      f"cuobjdump not found: {install_hint('gpu-compile')} (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)"
    )
  # Imported where they are used: ragtune.deviceless.aot imports this module on hosts without the extra.
  missing = [name for name in ("cramjam", "elftools") if importlib.util.find_spec(name) is None]
  if missing:
    raise MachineCodeError(f"{', '.join(missing)} not found: {install_hint('gpu-compile')} (cramjam, pyelftools)")
  return [k for cubin in cubins(serialized) if only is None or only in cubin for k in read_cubin(cubin, cuobjdump)]
