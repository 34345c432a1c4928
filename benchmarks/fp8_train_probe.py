"""fp8 training (kernels.ragged_dot's quantize=) on one GPU: a training step's three matmuls
(fwd, dlhs, drhs by jax.vjp) in fp8 beside our bf16 kernels, XLA's dequantized fp8 path and
three dense bf16 matmuls of the same FLOPs; then each fp8 op and each quantization pass alone.
Equal group sizes, normal bf16 inputs. Wall-clock medians of 10 calls after 2 warm-up calls.
Before timing, each problem's fp8 result (a smaller m) is checked against XLA's path of the
same recipe.

  python benchmarks/fp8_train_probe.py          # writes $OUT/fp8_train.csv (default: .)
  DEADLINE=300 python benchmarks/fp8_train_probe.py   # start nothing new after 300 s
  TINY=1 python benchmarks/fp8_train_probe.py   # one small problem (a CPU: XLA, interpreted kernels)

Rows: the step's "bf16", "fp8" (the weights quantized in the call), "fp8, weights quantized
once" (rhs_quantized: the copy made once per optimizer step, not timed in the step), "xla fp8"
(backend="xla": dequantized to f32), "dense bf16 x3"; then "fwd", "dlhs", "drhs" (each fp8
kernel with its activation quantization) and the passes ("quantize x 1x128", ...).
"""

import csv
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
from kernels.ragged_dot import train_op

T0 = time.time()
DEADLINE = float(os.environ.get("DEADLINE", 420))
FMT = "float8_e4m3fn:block128"
F8 = "float8_e4m3fn"
BACKEND = os.environ.get("BACKEND", "auto")
PROBLEMS = [
  ("DeepSeek-V3 up", 131072, 7168, 2048, 256),
  ("DeepSeek-V3 down", 131072, 2048, 7168, 256),
]
if os.environ.get("TINY"):
  PROBLEMS = [("tiny", 512, 256, 256, 4)]
DEVICE = jax.devices()[0].device_kind
out_path = os.path.join(os.environ.get("OUT", "."), "fp8_train.csv")
rows = []


def say(*a):
  print(" ".join(str(x) for x in a), flush=True)


def save():
  tmp = out_path + ".tmp"
  with open(tmp, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["problem", "m", "k", "n", "g", "what", "ms", "tflops", "device", "jax"])
    w.writerows(rows)
  os.replace(tmp, out_path)


def timeit(f, args, n=10):
  c = jax.jit(f).lower(*args).compile()
  for _ in range(2):
    jax.block_until_ready(c(*args))
  ts = []
  for _ in range(n):
    t = time.perf_counter()
    jax.block_until_ready(c(*args))
    ts.append(time.perf_counter() - t)
  return statistics.median(ts)


def check(name, m, k, n, g):
  """The fp8 step on `BACKEND` against XLA's path of the same recipe (the same quantized
  values; the two differ by accumulation order and the outputs' rounding)."""
  keys = jax.random.split(jax.random.key(1), 3)
  gs = jnp.full((g,), m // g, jnp.int32)
  x = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
  w = (jax.random.normal(keys[1], (g, k, n)) / np.sqrt(k)).astype(jnp.bfloat16)
  dout = jax.random.normal(keys[2], (m, n), jnp.bfloat16)

  def step(backend):
    call = lambda a, b: kernels.ragged_dot(a, b, gs, quantize=FMT, backend=backend)
    out, vjp = jax.vjp(call, x, w)
    return (out, *vjp(dout))

  got, ref = jax.jit(lambda: step(BACKEND))(), jax.jit(lambda: step("xla"))()
  for op, a, b in zip(("fwd", "dlhs", "drhs"), got, ref):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    err = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
    say(f"{name} check m={m} {op}: max|{BACKEND} - xla| / max|xla| = {err:.2e}", "ok" if err < 2e-2 else "WRONG")


for name, m, k, n, g in PROBLEMS:
  if time.time() - T0 > DEADLINE:
    say("deadline: stop before", name)
    break
  try:
    check(name, min(m, 4096), k, n, min(g, 8))
  except Exception as e:
    say(name, "check ERROR", repr(e)[:300])
  keys = jax.random.split(jax.random.key(0), 3)
  gs = jnp.full((g,), m // g, jnp.int32)
  x = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
  w = (jax.random.normal(keys[1], (g, k, n)) / np.sqrt(k)).astype(jnp.bfloat16)
  dout = jax.random.normal(keys[2], (m, n), jnp.bfloat16)
  flops = 2.0 * m * k * n

  def rep(what, t, ops=3):
    rows.append([name, m, k, n, g, what, round(t * 1e3, 4), round(ops * flops / t / 1e12, 1), DEVICE, jax.__version__])
    say(f"{name} [{m},{k}]x[{g},{k},{n}] | {what:<36} | {t * 1e3:9.3f} ms | {ops * flops / t / 1e12:7.1f} TF/s")
    save()

  def step(**kw):
    def f(a, b, d, *extra):
      if extra:
        kw["rhs_quantized"] = quant.TrainingWeights(*extra, False)
      out, vjp = jax.vjp(lambda a, b: kernels.ragged_dot(a, b, gs, **kw), a, b)
      return (out, *vjp(d))

    return f

  tw = jax.jit(lambda w: quant.training_weights(w, F8))(w)
  cached = (tw.values, tw.scales, tw.other)
  on = {op: c.backend for op, c in kernels.explain(x.shape, w.shape, w.dtype, quantize=FMT, backend=BACKEND).items()}
  say(name, "fp8 backends:", on)
  runs = [
    ("bf16", step(backend=BACKEND), (x, w, dout), 3),
    ("fp8", step(quantize=FMT, backend=BACKEND), (x, w, dout), 3),
    ("fp8, weights quantized once", step(quantize=FMT, backend=BACKEND), (x, w, dout, *cached), 3),
    ("xla fp8 (dequantized)", step(quantize=FMT, backend="xla"), (x, w, dout), 3),
    (
      "dense bf16 x3",  # the three products of a dense layer: x w, dout w^T, x^T dout
      lambda a, b, d: (
        jnp.dot(a, b, preferred_element_type=jnp.float32).astype(jnp.bfloat16),
        jnp.dot(d, b.T, preferred_element_type=jnp.float32).astype(jnp.bfloat16),
        jnp.dot(a.T, d, preferred_element_type=jnp.float32).astype(jnp.bfloat16),
      ),
      (x, w[0], dout),
      3,
    ),
    (
      "fwd",
      lambda a, q, s, o: train_op(
        "fwd", a, q, gs, fmt=FMT, backend=on["fwd"], out_dtype=jnp.bfloat16, rhs_scale=s, rhs_other=o
      ),
      (x, *cached),
      1,
    ),
    (
      "dlhs",
      lambda d, q, s, o: train_op(
        "dlhs", d, q, gs, fmt=FMT, backend=on["dlhs"], out_dtype=jnp.bfloat16, rhs_scale=s, rhs_other=o
      ),
      (dout, *cached),
      1,
    ),
    (
      "drhs",
      lambda a, d: train_op("drhs", a, d, gs, fmt=FMT, backend=on["drhs"], out_dtype=jnp.bfloat16),
      (x, dout),
      1,
    ),
    ("pass: quantize x 1x128", lambda a: quant.quantize(a, F8, (1, 128)), (x,), 0),
    ("pass: quantize w 128x128", lambda b: quant.quantize_weights(b, F8), (w,), 0),
    (
      "pass: dout, x in 128-token blocks",
      lambda a, d: [quant.quantize_tokens(v, quant.token_blocks(gs, m, None, g), F8) for v in (a, d)],
      (x, dout),
      0,
    ),
  ]
  for what, f, args, ops in runs:
    if time.time() - T0 > DEADLINE:
      say("deadline: stop at", name, what)
      break
    try:
      rep(what, timeit(f, args), ops)
    except Exception as e:
      say(name, what, "ERROR", repr(e)[:300])
  del x, w, dout, cached
say("device", DEVICE, "jax", jax.__version__, "done in", round(time.time() - T0), "s; wrote", out_path)
