"""fp8 block128 (DeepSeek-V3's format) on one GPU, forward: mosaic_gpu's block128 configs (the
default's 256-deep steps, the serial 128-deep ones, 128x256 cells) beside pallas_gpu's fp8,
mosaic_gpu's channelwise fp8 kernel (the same wgmma, no promotion), our bf16 kernel and dense
bf16 and fp8 matmuls of the same FLOPs. Equal group sizes; random fp8 values and scales (timing
only; the Mixtral case also checks the first group against the dequantized reference by
kernels.quant's bound). Wall-clock medians of 10 calls after 2.

  python benchmarks/fp8_block128_probe.py            # writes $OUT/fp8_probe.txt (default: .)
  DEADLINE=300 python benchmarks/fp8_block128_probe.py   # start nothing new after 300 s
  TINY=1 python benchmarks/fp8_block128_probe.py     # one small problem (a CPU: interpreted)
"""

import os
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())
import jax
import jax.numpy as jnp
import numpy as np

import kernels
from kernels import quant

T0 = time.time()
DEADLINE = float(os.environ.get("DEADLINE", 330))
out_path = os.path.join(os.environ.get("OUT", "."), "fp8_probe.txt")
log = open(out_path, "w")


def say(*a):
  s = " ".join(str(x) for x in a)
  print(s, flush=True)
  log.write(s + "\n")
  log.flush()


say(
  "device",
  jax.devices()[0].device_kind,
  "jax",
  jax.__version__,
  "timer: wall clock, median of per-call times after 2 warm-up calls",
)


def timeit(f, args, n=10):
  c = jax.jit(f).lower(*args).compile()
  for _ in range(2):
    jax.block_until_ready(c(*args))
  ts = []
  for _ in range(n):
    t = time.perf_counter()
    jax.block_until_ready(c(*args))
    ts.append(time.perf_counter() - t)
  return statistics.median(ts), c


PROBLEMS = [
  ("DeepSeek-V3 up", 131072, 7168, 2048, 256),
  ("DeepSeek-V3 down", 131072, 2048, 7168, 256),
  ("Mixtral", 8192, 4096, 14336, 8),
]
if os.environ.get("TINY"):
  PROBLEMS = [("Mixtral", 256, 256, 256, 2)]
F8 = jnp.float8_e4m3fn


def time_all(runs, rep, name):
  """Each (label, fn, args) timed and reported, until the deadline; a failure is reported."""
  for label, f, args in runs:
    if time.time() - T0 > DEADLINE:
      return
    try:
      t, _ = timeit(f, args)
      rep(label, t)
    except Exception as e:
      say(name, label, "ERROR", repr(e)[:300])


for name, m, k, n, g in PROBLEMS:
  if time.time() - T0 > DEADLINE:
    say("deadline: stop before", name)
    break
  key = jax.random.key(0)
  k1, k2, k3, k4 = jax.random.split(key, 4)
  gs = jnp.full((g,), m // g, jnp.int32)
  lq = jax.random.normal(k1, (m, k), jnp.bfloat16).astype(F8)
  rq = (jax.random.normal(k2, (g, n, k), jnp.bfloat16)).astype(F8)  # [g, n, k]
  kb, nb = -(-k // 128), -(-n // 128)
  ls = jax.random.uniform(k3, (m, kb), jnp.float32, 0.5, 2.0) / 64
  rs = jax.random.uniform(k4, (g, kb, nb), jnp.float32, 0.5, 2.0) / 64
  ls_c, rs_c = ls[:, :1], rs[:, :1, :1].repeat(n, axis=2)  # channelwise scales
  flops = 2.0 * m * k * n

  def rep(label, t):
    say(f"{name} [{m},{k}]x[{g},{k},{n}] | {label:<44} | {t * 1e3:8.3f} ms | {flops / t / 1e12:7.1f} TF/s")

  def b128(cfg):
    return lambda a, b, s1, s2: kernels.ragged_dot(
      a, b, gs, lhs_scale=s1, rhs_scale=s2, transpose_rhs=True, backend="mosaic_gpu", config=cfg
    )

  outs = {}
  for label, cfg in (
    ("mosaic_gpu b128 128x128 bk256 cs3 (default)", kernels.MosaicConfig(128, 128, 256, 3, 16)),
    ("mosaic_gpu b128 128x128 bk128 cs5 (serial)", kernels.MosaicConfig(128, 128, 128, 5, 16)),
    ("mosaic_gpu b128 128x256 bk128 cs4", kernels.MosaicConfig(128, 256, 128, 4, 16)),
  ):
    try:
      t, c = timeit(b128(cfg), (lq, rq, ls, rs))
      rep(label, t)
      outs[label] = c(lq, rq, ls, rs)
    except Exception as e:
      say(name, label, "ERROR", repr(e)[:300])
  if len(outs) > 1:
    (first, a), *rest = outs.items()
    for label, b in rest:
      say(name, f"{first} vs {label} bit-identical:", bool(jnp.array_equal(a, b)))
    say(name, "finite:", bool(jnp.isfinite(a.astype(jnp.float32)).all()))
  outs.clear()
  runs = [
    (
      "pallas_gpu b128 default",
      lambda a, b, s1, s2: kernels.ragged_dot(
        a, b, gs, lhs_scale=s1, rhs_scale=s2, transpose_rhs=True, backend="pallas_gpu"
      ),
      (lq, rq, ls, rs),
    ),
    (
      "mosaic_gpu channelwise default",
      lambda a, b, s1, s2: kernels.ragged_dot(
        a, b, gs, lhs_scale=s1, rhs_scale=s2, transpose_rhs=True, backend="mosaic_gpu"
      ),
      (lq, rq, ls_c, rs_c),
    ),
  ]
  time_all(runs, rep, name)
  del ls_c, rs_c
  xb = lq.astype(jnp.bfloat16)
  wb = rq.astype(jnp.bfloat16).swapaxes(1, 2)  # [g, k, n]
  runs = [
    ("bf16 mosaic_gpu default", lambda a, b: kernels.ragged_dot(a, b, gs, backend="mosaic_gpu"), (xb, wb)),
    (
      "dense bf16 matmul, same FLOPs",
      lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(jnp.bfloat16),
      (xb, wb[0]),
    ),
  ]
  time_all(runs, rep, name)
  try:
    da, db = lq, rq[0].T
    t, _ = timeit(
      lambda a, b: jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32).astype(
        jnp.bfloat16
      ),
      (da, db),
    )
    rep("dense fp8 matmul, same FLOPs", t)
  except Exception as e:
    say(name, "dense fp8", "ERROR", repr(e)[:300])
  if name == "Mixtral" and time.time() - T0 < DEADLINE:
    try:
      got = np.asarray(jax.jit(b128(kernels.MosaicConfig(128, 128, 128, 5, 16)))(lq, rq, ls, rs), np.float64)
      sub = slice(0, m // g)  # the first group, against the dequantized reference in float32
      a, b = quant.dequantize(lq[sub], rq[:1], ls[sub], rs[:1], transpose_rhs=True)
      ref = np.asarray(jnp.dot(a, b[0].T, precision=jax.lax.Precision.HIGHEST), np.float64)
      es = np.sqrt(np.asarray(jnp.dot(a * a, (b[0] * b[0]).T, precision=jax.lax.Precision.HIGHEST), np.float64))
      bound = quant.tolerance("float8_e4m3fn:block128", k, jnp.bfloat16).bound(ref, es)
      say(
        name,
        "b128 default within kernels.quant's bound on group 0:",
        bool(np.all(np.abs(got[sub] - ref) <= bound)),
        "max err/bound",
        float((np.abs(got[sub] - ref) / bound).max()),
      )
    except Exception as e:
      say(name, "check ERROR", repr(e)[:300])
  del lq, rq, xb, wb
say("done in", round(time.time() - T0), "s")
