"""An analytic model of grouped-matmul speed on one H100 SXM (or B200): a model, not a measurement.

The machine's figures (dense BF16 peak, SMs, memory bandwidth, L2) are the facts files' of
kernels/gpu_facts/, so `--device` takes any named Hopper (h100, h100-pcie, h200, gh200, h20)
or datacenter Blackwell (b200, gb200, b300). On the H20, whose tensor rate is capped far under
its SMs x clock, the clock the peak implies (0.46 GHz) understates its shared memory's pace.

For each anchor problem's forward pass and each kernel design it adds up what bounds the
kernel, from published hardware figures and the kernel's own tiles and launch order, with no
term fitted to a timing:

  kernel          output tile (CTA) and per warpgroup     rows            order / grid
  mosaic v2       kernels/mosaic_gpu default 128x256x64,  group-start on  persistent, group-major bands (group_m)
                  two consumer WGs of 64x256, a TMA       8-row boxes
                  producer WG
  mosaic v1       128x128x64, one WG (2 wgmma of 64x128)  aligned         persistent, band_snake (grid_block_n 4)
  triton          kernels/pallas_gpu default 128x64x256   group-start     one program per cell, banded (group_m)
                  (bm x bk x bn), 8 warps: two WGs of
                  64x256, no warp specialization
  tokamax mosaic  tokamax 0.0.12 sm90 heuristic:          aligned         one program per cell, column fastest
                  64x64x128, 2 stages, one WG
  tokamax triton  tokamax 0.0.12 heuristic: 128x128x32,   group-start     one program per (row tile, col, group),
                  4 warps (one WG of 128x128), 4 stages                   the row tile fastest

Terms, per kernel (bf16 in and out):
1. MMA: every issued cell (row tile x column block, partial tiles counted whole: the tile
   waste) costs 2 * block_m * block_n * k FLOPs at 989.4 TF/s / 132 SMs. 989.4 TF/s is the
   H100 SXM dense BF16 Tensor Core peak (NVIDIA H100 datasheet,
   https://www.nvidia.com/en-us/data-center/h100/: 1,979 TF/s with sparsity, half without);
   it equals 132 SMs x 4 tensor cores x 1024 FLOP/clk x 1.83 GHz, the clock used below.
2. Shared memory: wgmma reads both operands from shared memory. A warpgroup with a Mw x Nw
   accumulator issues Mw / 64 wgmma of m64nNw (PTX ISA, "wgmma.mma_async" shapes), each
   reading its 64 rows of A and all of B: 2 * k * (Mw + Mw / 64 * Nw) bytes a cell per
   warpgroup. The SM reads 128 B/clk (32 banks of 4 bytes a clock: CUDA C++ Programming Guide,
   "Shared Memory", https://docs.nvidia.com/cuda/cuda-c-programming-guide/#shared-memory-5-x),
   234 GB/s per SM at 1.83 GHz. A cell takes max(MMA, shared-memory) time: the two overlap.
   TMA's writes into shared memory and the epilogue are not counted (whether they share the
   read port is not published); the "+writes" column shows the shared-memory load if they
   did, (block_m + block_n) * 2 bytes more per unit of k.
3. Per-tile overhead: a kernel whose warps both load and multiply restarts its pipeline for
   every cell, and waits for its first loads: --fill-us (1 us, about one HBM round trip and
   TMA issue) a cell. It is 0 where a producer warpgroup runs ahead into the next cell
   (mosaic v2) or another resident program computes meanwhile (2+ programs per SM).
4. Waves: the 132 SMs take cells in turn, so the compute time is ceil(cells / 132) cell times.
5. HBM: the bytes benchmarks/l2_traffic.py's LRU model fetches for the kernel's launch order
   with a 50 MiB L2 (reads and output writes), at 3.35 TB/s (H100 SXM, same datasheet),
   overlapped with the compute: time = max(compute, HBM).

With --dtype float8_e4m3fn each design runs on fp8 operands: MMA at twice the 16-bit rate
(H100 SXM: 3,958 TF/s FP8 against 1,979 BF16, both with sparsity, on the datasheet above; HGX
B200: 9 against 4.5 PFLOPS), one byte an element in shared memory and HBM, and bf16 out. It
models the fp8 wgmma / tcgen05 kind::f8f6f4 kernels those designs would be. ragtune's fp8
kernel today is pallas_gpu's, whose dots run on f16 mma.sync (docs/quantization.md):
not modelled here.

With --dtype float8_e4m3fn:block128 (H100) it models DeepSeek-V3's format, 128x128 block scales
promoted per 128-deep k block, in four kernels:

  mosaic b128     kernels/mosaic_gpu's block128 default: 128x128 cells (two consumer WGs of
                  64x128), 256-deep steps: each consumer issues both k blocks' wgmmas into two
                  step accumulators, promotes the first while the second runs, then waits for
                  and promotes the second (gmm.py's overlapped_step).
  b128 serial     the same cells with 128-deep steps (block_k 128, 5 stages): each consumer
                  waits for its step's wgmma, then promotes it (the default until then).
  triton b128     kernels/pallas_gpu's block128 default; its dot runs as f16 mma.sync (HMMA,
                  docs/quantization.md), at most the 16-bit peak: modelled at that peak, with
                  fp8 bytes, its promotion not counted (an upper bound).
  mosaic v2 bf16  our bf16 kernel on the same shape (bf16 bytes and rate): what fp8 buys.

  A promotion is F = wg_rows * wg_cols / 128 FMA a thread (one a clock a lane: each of the SM's
  four schedulers issues one warp instruction a clock, and a warpgroup has a warp on each) plus
  --promote-latency-clk L (the wgmma's completion and the scale loads, which no public figure
  gives; 0 by default). T is one consumer's k block at the MMA rate. --phase says how the
  consumers' promotions fall, per k block of a CTA of W consumers:
    in-phase (default): they wait on the same TMA barrier each step, so they issue, wait and
      promote together, their FMAs sharing the schedulers: serial W T + W F + L; overlapped
      W T + (W F + L) / 2 (the first block's promotion runs under the second's wgmmas while
      W F + L <= W T).
    staggered: each consumer promotes while the others' wgmmas run: serial max(W T, T + F + L),
      overlapped max(W T, T + (F + L) / 2). Promotion is then hidden in both.
  One H100 (results/nvidia-h100-80gb-hbm3/fp8_block128_probe.txt) ran the serial kernel at 0.81
  of the same cells without promotion (channelwise scales): in-phase predicts 0.80 at L = 0,
  staggered 1.00. That choice of phase is the only thing a timing told the model.

The column "L2 B/clk" is each SM's operand bytes loaded by TMA (from L2) a clock at the
modelled pace, which the model does not bound (no public figure for H100's L2 bandwidth):
compare it between designs, as a 128x128 fp8 cell asks L2 for a third more a clock than
the bf16 kernel's 128x256 cell.

With --device b200 it models the Blackwell kernels (kernels/mosaic_blackwell, tcgen05) on a
B200 instead, the same terms with these figures (l2_traffic.py's docstring has the sources of
the machine's):

  tcgen05         kernels/mosaic_blackwell default         group-start on  persistent, group-major bands (group_m),
                  128x256x64 a CTA, accumulator in TMEM,   8-row boxes     148 CTAs
                  a TMA warp, an MMA warp, an epilogue WG
  tcgen05 pair    the same with cta_pair: two CTAs (SMs)   group-start on  74 pairs
                  compute one 256x256 cell                 8-row boxes

1. MMA at 2250 TF/s dense BF16 (HGX B200 at 1000 W: 4.5 PFLOPS with sparsity, half without),
   over 148 SMs; a pair's cell runs on its two SMs at twice one SM's rate.
2. Shared memory: tcgen05.mma reads A and B from shared memory (PTX ISA, "tcgen05.mma"; the
   accumulator is in TMEM, no register file). A CTA's 128 x block_n MMA reads its 128 rows of
   A and block_n columns of B per unit of k. With cta_pair each CTA holds its 128 rows of A
   and half of B's columns, and the model takes each CTA's shared memory to be read once for
   the pair's MMA (each half of B going to both SMs' tensor cores): per SM, 128 rows and
   block_n / 2 columns. An SM's tensor cores are taken to issue 8192 dense 16-bit FLOP a clock
   (twice Hopper's 4096; 2250 TF/s / 148 SMs / 8192 is 1.86 GHz, the clock the model uses,
   NVIDIA publishing none), and shared memory 128 B/clk as on Hopper. SemiAnalysis's B200
   measurements ("Dissecting Nvidia Blackwell", March 2026,
   https://newsletter.semianalysis.com/p/dissecting-nvidia-blackwell-tensor, from its public
   summary) find MMAs with both operands in shared memory and N < 128 bound at about 128
   B/clk, as these two figures predict (a 128 x 64 MMA needs 192 B/clk, a 128 x 128 one 128).
   So one CTA's 128x256 cell reads 75% of the port, a pair's 50%; "+writes" adds TMA's writes
   as for the H100.
3. Per-tile overhead: none; the TMA warp runs ahead into the next cell and the accumulator is
   double-buffered in TMEM, so a cell's epilogue overlaps the next cell's MMAs.
4. Waves: ceil(cells / 148) (a pair: ceil(cells / 74)) cell times.
5. HBM: l2_traffic.py's LRU replay with a 126.5 MiB L2 (--l2 66 for one die's half) at 8 TB/s.

Predicted TF/s = 2 m k n / time. What it leaves out, so it is an upper bound for every
kernel: the cost of issuing loads and waiting on barriers from the MMA warps, register
pressure, clock throttling under power, launch cost of empty programs (tokamax triton
launches cdiv(m, block_m) x g row slots per column, most of which return at once), and
L2 bandwidth (on a B200, also the traffic between its two dies' L2 halves). It tells which
bound binds each design, not how fast a kernel runs.

  python benchmarks/gemm_model.py                  # the anchors' fwd, full size (about a minute)
  python benchmarks/gemm_model.py --quick          # m / 8
  python benchmarks/gemm_model.py --device b200    # the tcgen05 kernels on a B200
  python benchmarks/gemm_model.py --dtype float8_e4m3fn:block128 --only deepseek
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import l2_traffic as l2  # noqa: E402

from kernels import gpus  # noqa: E402
from kernels.mosaic_gpu import config as mosaic  # noqa: E402
from kernels.mosaic_gpu import gmm as mosaic_gmm  # noqa: E402
from kernels.pallas_gpu import config as triton  # noqa: E402

SMEM_BYTES_PER_CLK = 128
WGMMA_M = mosaic.WGMMA_M
ANCHORS = [p for p in l2.PROBLEMS if p.op == "fwd"]


@dataclasses.dataclass(frozen=True)
class Gpu:
  """The machine's figures the model takes (the module docstring says where each comes from)."""

  name: str
  peak_flops: float  # dense 16-bit MMA
  sms: int
  clock_hz: float
  smem_bytes_per_clk: int
  hbm_bytes_s: float
  l2_bytes: int


# Dense 16-bit tensor-core FLOPs an SM issues a clock, by arch (docstring): the model's clock is
# the datasheet peak over SMs x this, the clock the peak implies.
MMA_FLOP_PER_CLK = {"hopper": 4096, "blackwell": 8192}


def gpu_figures(name: str) -> Gpu:
  """The model's machine: a named GPU's facts (kernels/gpu_facts/<name>.toml, its first product)."""
  g = gpus.gpu(name)
  peak = g.tflops["bf16"] * 1e12
  clock = peak / (g.sms * MMA_FLOP_PER_CLK[g.arch.name])
  return Gpu(g.title, peak, g.sms, clock, SMEM_BYTES_PER_CLK, g.variants[0].memory_bytes_per_s, g.l2_bytes)


# Every named Hopper and datacenter Blackwell GPU: the archs whose kernels the designs model.
GPUS = {name: gpu_figures(name) for name, g in gpus.gpus().items() if g.arch.name in MMA_FLOP_PER_CLK}
H100, B200 = GPUS["h100"], GPUS["b200"]
PEAK_FLOPS = H100.peak_flops


@dataclasses.dataclass(frozen=True)
class Design:
  """A kernel as the model sees it: its walk (l2_traffic.Kernel), its warpgroup tile, and
  whether something hides its per-cell pipeline fill."""

  kernel: l2.Kernel
  wg_rows: int  # each warpgroup's accumulator rows (tcgen05: each CTA's, in TMEM)
  wg_cols: int
  fill_hidden: bool
  mma: str = "wgmma"  # wgmma: each warpgroup reads its A rows and all of B; tcgen05: each SM its share of both
  dtype: str = ""  # its operands, when not the run's (--dtype)
  rate: float | None = None  # its MMA FLOPs a clock against the 16-bit peak; None: by dtype
  promoted: bool = False  # block scales promoted per 128-deep k block (module docstring)
  overlapped: bool = False  # two k blocks a step, the first promoted under the second's wgmma
  narrow_tail: bool = False  # a cell whose rows fit in 64 runs as a 64-row one (module docstring, term 1)


@dataclasses.dataclass(frozen=True)
class Prediction:
  cells: int
  waste_pct: float  # MMA work beyond 2 m k n, in %
  mma_s: float  # compute time, waves x cell time, with no overhead
  smem_pct: float  # shared-memory reads per cell against the port, at the MMA's pace, in %
  smem_writes_pct: float  # the same with TMA's operand writes counted
  overhead_s: float  # waves x per-cell fill
  fetched: int
  unique: int
  hbm_s: float
  time_s: float
  tflops: float
  tflops_writes: float  # if TMA's writes shared the port
  l2_bytes_per_clk: float  # each SM's operand loads from L2 a clock, at the modelled pace
  narrow: int = 0  # of the cells, those run as 64-row cells (narrow_tail)
  of_dense: float = 1.0  # the model's time for a dense matmul of the same FLOPs and cells, over this one's


def designs(p: l2.Problem) -> list[Design]:
  """The five kernels of the module docstring, for problem p."""
  v2 = l2.mosaic_v2(p)
  cfg = mosaic.default(p.op, "bfloat16", p.m, p.k, p.n, p.g, device_kind=l2.HOPPER)
  wg_rows, wg_cols, _ = cfg.consumer_tile(p.op)
  v1 = l2.mosaic_v1(p)
  tri = l2.triton_kernel(p, l2.default_for(p, "hopper"))
  tri_wgs = triton.default(p.op, "bfloat16", p.m, p.k, p.n, p.g, device_kind=l2.HOPPER).num_warps // 4
  # tokamax's kernels launch one program per cell, so their shared memory sets how many share an SM.
  tok_mosaic = l2.Kernel(
    name="tokamax mosaic",
    config="bm64 bn64 bk128 s2",
    block_m=64,
    block_n=64,
    block_k=128,
    band=1,
    order="n_fastest",
    group_start=False,
    align=1,
    persistent=False,
    per_sm=l2.programs_per_sm(2 * (64 * 128 + 128 * 64) * 2 + 64 * 64 * 2),
  )
  tok_bm = min(128, 1 << (p.m - 1).bit_length())
  tok_triton = l2.Kernel(
    name="tokamax triton",
    config=f"{tok_bm}x32x128 w4 s4",
    block_m=tok_bm,
    block_n=128,
    block_k=32,
    band=1 << 20,
    order="banded",
    group_start=True,
    align=1,
    persistent=False,
    per_sm=l2.programs_per_sm(4 * (tok_bm * 32 + 32 * 128) * 2),
  )
  return [
    Design(v2, wg_rows, wg_cols, True, narrow_tail=cfg.narrow_tail_applies(p.op)),
    Design(v1, v1.block_m, v1.block_n, False),
    Design(tri, tri.block_m // tri_wgs, tri.block_n, tri.per_sm > 1),
    Design(tok_mosaic, 64, 64, tok_mosaic.per_sm > 1),
    Design(tok_triton, tok_bm, 128, tok_triton.per_sm > 1),
  ]


def blackwell_designs(p: l2.Problem) -> list[Design]:
  """The tcgen05 kernels of the module docstring (one CTA a cell, and the CTA pair), for problem p."""
  out = []
  for pair in (False, True):
    kern = l2.tcgen05(p, pair=pair)
    out.append(Design(kern, kern.block_m // kern.ctas, kern.block_n, True, mma="tcgen05"))
  return out


FP8_RATE = 2  # fp8 MMA FLOPs a clock against 16-bit, on Hopper and Blackwell (docstring)
BLOCK128 = "float8_e4m3fn:block128"
SCALE_BLOCK = 128  # block128's k block: one promotion a step


def block128_designs(p: l2.Problem) -> list[Design]:
  """The four kernels of the module docstring's block128 table, for problem p (fwd)."""
  c = mosaic.default(p.op, BLOCK128, p.m, p.k, p.n, p.g, device_kind=l2.HOPPER)
  serial = dataclasses.replace(c, block_k=mosaic.FP8_BLOCK_K, max_concurrent_steps=5)
  mosaic_fp8 = []
  for name, cfg in (("mosaic b128", c), ("b128 serial", serial)):
    rows, cols, _ = cfg.consumer_tile(p.op)
    blocks = f"bm{cfg.block_m} bn{cfg.block_n} bk{cfg.block_k} cs{cfg.max_concurrent_steps}"
    kern = l2.Kernel(
      name, blocks, cfg.block_m, cfg.block_n, cfg.block_k, cfg.group_m, "banded", True, l2.ROW_TILE, True
    )
    overlapped = cfg.block_k == mosaic.FP8_PAIR_K
    mosaic_fp8.append(
      Design(kern, rows, cols, True, dtype=BLOCK128, rate=FP8_RATE, promoted=True, overlapped=overlapped)
    )
  t = triton.default(p.op, BLOCK128, p.m, p.k, p.n, p.g, device_kind=l2.HOPPER)
  tri = dataclasses.replace(l2.triton_kernel(p, t, dtype=BLOCK128), name="triton b128")
  bf16 = designs(p)[0]
  return [
    *mosaic_fp8,
    Design(tri, tri.block_m // (t.num_warps // 4), tri.block_n, tri.per_sm > 1, dtype=BLOCK128, rate=1),
    dataclasses.replace(bf16, kernel=dataclasses.replace(bf16.kernel, name="mosaic v2 bf16"), dtype="bfloat16"),
  ]


def predict(
  p: l2.Problem,
  d: Design,
  *,
  fill_s: float,
  l2_bytes: int | None = None,
  gpu: Gpu = H100,
  dtype: str = "bfloat16",
  promote_latency_clk: float = 0.0,
  phase: str = "in-phase",
) -> Prediction:
  """The model's time for problem p (fwd) run by design d on `gpu` with operands of
  `dtype` (bfloat16 or float8_e4m3fn; the design's own when it has one); see the module
  docstring."""
  kern = d.kernel
  dtype = d.dtype or dtype
  l2_bytes = gpu.l2_bytes if l2_bytes is None else l2_bytes
  traffic = l2.simulate(p, kern, sms=gpu.sms, l2_bytes=l2_bytes, dtype=dtype)
  b = float(l2.common.itemsize(dtype))
  peak = gpu.peak_flops * (d.rate if d.rate is not None else FP8_RATE if b == 1 else 1)
  cell_flops = 2.0 * kern.block_m * kern.block_n * p.k
  cell_mma = cell_flops / (peak / gpu.sms * kern.ctas)  # a pair's cell on its two SMs
  if d.promoted:
    block_clk = promoted_block_clk(d, peak / gpu.sms / gpu.clock_hz, promote_latency_clk, phase)
    blocks = math.ceil(p.k / kern.block_k) * (kern.block_k // SCALE_BLOCK)  # an odd count's zero half too
    cell_mma = blocks * block_clk / gpu.clock_hz
  if d.mma == "tcgen05":  # per SM: its A rows and its share of B's columns
    smem_reads = b * p.k * (d.wg_rows + kern.block_n // kern.ctas)
  else:
    wgs = (kern.block_m * kern.block_n) // (d.wg_rows * d.wg_cols)
    smem_reads = wgs * b * p.k * (d.wg_rows + d.wg_rows // WGMMA_M * d.wg_cols)
  smem_writes = b * p.k * (kern.block_m + kern.block_n) / kern.ctas
  port = gpu.smem_bytes_per_clk * gpu.clock_hz
  # narrow_tail: its 64-row cells, two consumers of 64 x block_n / 2 each (m64n(block_n/2) wgmma)
  narrow = narrow_cells(p, kern) if d.narrow_tail else 0
  narrow_mma = cell_mma * WGMMA_M / kern.block_m
  narrow_reads = 2 * b * p.k * (WGMMA_M + kern.block_n // 2)
  slots = max(1, gpu.sms // kern.ctas)
  fill = 0.0 if d.fill_hidden else fill_s
  hbm_s = traffic.fetched / gpu.hbm_bytes_s
  useful = 2.0 * p.m * p.k * p.n

  def compute_time(smem_bytes: float, narrow_bytes: float, fill: float = fill) -> float:
    """Waves of whole cells; a narrow cell counts as the fraction of one it takes."""
    cell = max(cell_mma, smem_bytes / port) + fill
    narrow_cell = max(narrow_mma, narrow_bytes / port) + fill
    return math.ceil(((traffic.cells - narrow) * cell + narrow * narrow_cell) / cell / slots) * cell

  def kernel_time(smem_bytes: float, narrow_bytes: float) -> float:
    return max(compute_time(smem_bytes, narrow_bytes), hbm_s)

  time_s = kernel_time(smem_reads, narrow_reads)
  # The same cells over a dense [m, k] x [k, n] of the same FLOPs: every tile whole but the
  # last row tile, the unique bytes from HBM once.
  dense_cells = -(-p.m // kern.block_m) * -(-p.n // kern.block_n)
  dense_compute = math.ceil(dense_cells / slots) * (max(cell_mma, smem_reads / port) + fill)
  dense_s = max(dense_compute, traffic.unique / gpu.hbm_bytes_s)
  return Prediction(
    cells=traffic.cells,
    waste_pct=100.0 * ((traffic.cells - narrow + narrow * WGMMA_M / kern.block_m) * cell_flops / useful - 1.0),
    mma_s=compute_time(0.0, 0.0, fill=0.0),
    smem_pct=100.0 * smem_reads / port / cell_mma,
    smem_writes_pct=100.0 * (smem_reads + smem_writes) / port / cell_mma,
    overhead_s=math.ceil(traffic.cells / slots) * fill,
    fetched=traffic.fetched,
    unique=traffic.unique,
    hbm_s=hbm_s,
    time_s=time_s,
    tflops=useful / time_s / 1e12,
    tflops_writes=useful / kernel_time(smem_reads + smem_writes, narrow_reads + smem_writes) / 1e12,
    l2_bytes_per_clk=smem_writes * kern.ctas * traffic.cells / (time_s * gpu.clock_hz * gpu.sms),
    narrow=narrow,
    of_dense=dense_s / time_s,
  )


PHASES = ("in-phase", "staggered")


def promoted_block_clk(d: Design, flop_per_clk: float, latency_clk: float, phase: str) -> float:
  """A CTA's clocks a 128-deep k block of a promoted design (module docstring): T, F and L of
  its consumers, in-phase or staggered."""
  if phase not in PHASES:
    raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
  wgs = (d.kernel.block_m * d.kernel.block_n) // (d.wg_rows * d.wg_cols)
  t = 2.0 * d.wg_rows * d.wg_cols * SCALE_BLOCK / flop_per_clk
  f = d.wg_rows * d.wg_cols / 128
  if phase == "staggered":
    exposed = (f + latency_clk) / 2 if d.overlapped else f + latency_clk
    return max(wgs * t, t + exposed)
  together = wgs * f + latency_clk
  if not d.overlapped:
    return wgs * t + together
  return wgs * t + max(together - wgs * t, 0.0) / 2 + together / 2  # the first block's, beyond the second's wgmmas


def narrow_cells(p: l2.Problem, kern: l2.Kernel) -> int:
  """The cells kernels/mosaic_gpu's gmm runs as 64-row cells on problem p (its own schedule and
  rule: gmm.tile_bounds, gmm.computed_rows), times the column blocks."""
  rows, _, cols = l2.common.op_dims(p.op, p.m, p.k, p.n)
  m_pad = l2.common.round_up(rows, l2.ROW_TILE)
  cfg = mosaic.MosaicConfig(kern.block_m, kern.block_n, kern.block_k, narrow_tail=True)
  _, _, computed = mosaic_gmm.host_tiles(p.group_sizes(), m_pad, p.g, cfg)
  return int((computed == WGMMA_M).sum()) * -(-cols // kern.block_n)


def bound(r: Prediction) -> str:
  """Which term sets the time."""
  if r.hbm_s >= r.time_s:
    return "HBM"
  return "smem" if r.smem_pct > 100.0 else "MMA"


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--fill-us", type=float, default=1.0, help="pipeline fill a cell pays when nothing hides it")
  ap.add_argument("--quick", action="store_true", help="m / 8 on every problem")
  ap.add_argument("--only", default="", help="substring of the problem names to run")
  ap.add_argument(
    "--device",
    default="h100",
    choices=sorted(GPUS),
    help="a Hopper (h100, h200, h20, ...): five designs; a Blackwell (b200, gb200, b300): the tcgen05 kernels",
  )
  ap.add_argument("--l2", type=float, default=None, help="L2 MB for the HBM replay (default: the device's whole L2)")
  ap.add_argument(
    "--dtype",
    default="bfloat16",
    choices=("bfloat16", "float8_e4m3fn", BLOCK128),
    help="the operands (output bf16); float8_e4m3fn:block128: the block-scaled kernels (H100)",
  )
  ap.add_argument(
    "--promote-latency-clk", type=float, default=0.0, help="block128: clocks a promotion waits beyond its FMAs"
  )
  ap.add_argument("--phase", default="in-phase", choices=PHASES, help="block128: how the consumers' promotions fall")
  args = ap.parse_args(argv)
  gpu = GPUS[args.device]
  hopper = gpus.gpu(args.device).arch.name == "hopper"
  l2_bytes = gpu.l2_bytes if args.l2 is None else int(args.l2 * 10**6)
  problems = [p for p in ANCHORS if args.only.lower() in p.name.lower()]
  if args.quick:
    problems = [dataclasses.replace(p, m=max(p.g, p.m // 8)) for p in problems]
  if args.dtype == BLOCK128 and not hopper:
    ap.error("--dtype float8_e4m3fn:block128 models the Hopper kernels: --device h100 (or another Hopper)")
  fp8 = args.dtype.startswith("float8_e4m3fn")
  peak = (
    f"{gpu.peak_flops * FP8_RATE / 1e12:.1f} TF/s dense fp8" if fp8 else f"{gpu.peak_flops / 1e12:.1f} TF/s dense bf16"
  )
  print(
    f"Analytic model (a model, not a measurement): {gpu.name}, {args.dtype} operands, {peak}, "
    f"{gpu.sms} SMs, smem {gpu.smem_bytes_per_clk} B/clk x {gpu.clock_hz / 1e9:.2f} GHz per SM, "
    f"HBM {gpu.hbm_bytes_s / 1e12:.2f} TB/s, L2 {l2_bytes / 1e6:.0f} MB (l2_traffic's LRU), "
    f"fill {args.fill_us:g} us a cell when not hidden"
  )
  tile, cw = ("WG tile", 20) if hopper else ("CTA MMA", 21)  # a tcgen05 pair's config is 21 wide
  cw = 21 if args.dtype == BLOCK128 else cw
  l2._table(
    f"| {'problem':<22} | {'kernel':<14} | {'config':<{cw}} | {tile} | cells  | waste   | MMA ms | smem | +writes | "
    f"fill ms | HBM GB, ratio | HBM ms | bound | TF/s | TF/s +writes | L2 B/clk | narrow | x dense |"
  )
  pick = designs if hopper else blackwell_designs
  if args.dtype == BLOCK128:
    pick = block128_designs
  for p in problems:
    for d in pick(p):
      r = predict(
        p,
        d,
        fill_s=args.fill_us * 1e-6,
        l2_bytes=l2_bytes,
        gpu=gpu,
        dtype=args.dtype,
        promote_latency_clk=args.promote_latency_clk,
        phase=args.phase,
      )
      wg = f"{d.wg_rows}x{d.wg_cols}"
      hbm = f"{r.fetched / 1e9:.2f}, {r.fetched / r.unique:.2f}x"
      print(
        f"| {p.name:<22} | {d.kernel.name:<14} | {d.kernel.config:<{cw}} | {wg:<7} | {r.cells:>6} | "
        f"{r.waste_pct:>6.1f}% | {r.mma_s * 1e3:>6.3f} | {r.smem_pct:>3.0f}% | {r.smem_writes_pct:>6.0f}% | "
        f"{r.overhead_s * 1e3:>7.3f} | {hbm:<13} | {r.hbm_s * 1e3:>6.3f} | {bound(r):<5} | {r.tflops:>4.0f} | "
        f"{r.tflops_writes:>12.0f} | {r.l2_bytes_per_clk:>8.1f} | {r.narrow:>6} | {r.of_dense:>7.3f} |"
      )
  return 0


if __name__ == "__main__":
  sys.exit(main())
