"""Measuring one problem: inputs, reference, compile under a timeout, check, time.

Timing: on an accelerator, tune-jax times the compiled candidates from profiler events
on the device (it is given concrete inputs, so group_sizes are the real ones, never
zeros). On a CPU host, wall-clock median of blocked calls; those timings are of the
Pallas *interpreter* and say nothing about GPU speed.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels import quant, registry
from kernels.common import element_dtype, itemsize, scheme
from kernels.ragged_dot import forward, grad_lhs, grad_rhs, train_op
from ragtune.device import reference as lax_reference
from ragtune.device.numerics import TOLERANCE, NumericsResult, compare
from ragtune.problems import limits
from ragtune.problems.shapes import Problem, trained

OpBuilder = Callable[[Problem, str, Any, bool], Callable[..., jax.Array]]


def _seed(p: Problem, salt: str) -> int:
  return int.from_bytes(hashlib.sha1(f"{p.key}|{salt}".encode()).digest()[:4], "little")


# Elements drawn in float32 at a time (whole rows of an operand's first axis): an operand is
# drawn straight into its own dtype, its peak the operand itself plus one such slice.
DRAW_CHUNK = limits.STEP_ELEMENTS


@functools.partial(jax.jit, static_argnames=("specs", "chunk"))
def _draw_all(keys, specs: tuple, chunk: int) -> tuple:
  """_draw of each (shape, dtype, divisor, blocks, transpose) in `specs` with its key, `chunk`
  elements a slice: one program for a problem's inputs (one compile, not one an operand)."""
  return tuple(_draw(k, *spec, chunk=chunk) for k, spec in zip(keys, specs))


def _draw(
  key, shape: tuple[int, ...], dtype: str, divisor: float, blocks: tuple | None, transpose: bool, *, chunk: int
):
  """A standard normal of `shape` divided by `divisor`, in `dtype`, or quantized to that
  element dtype with kernels.quant.quantize's `blocks` (then (values, scales); values with
  their last two axes swapped where `transpose`). Row i of the first axis is drawn from
  fold_in(key, i) alone, so the values do not depend on `chunk`."""
  rows, rest = shape[0], shape[1:]
  per = limits.step_rows(rows, math.prod(rest), chunk)

  def part(start):
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(start + jnp.arange(per))
    x = jax.vmap(lambda k: jax.random.normal(k, rest, jnp.float32))(keys) / divisor
    if blocks is None:
      return (x.astype(dtype),)
    q, scale = quant.quantize(x, dtype, blocks)
    return (q.swapaxes(-1, -2) if transpose else q, scale)

  if per == rows:  # one slice: no loop (and half the compile time)
    got = part(0)
    return got if blocks else got[0]
  outs = jax.eval_shape(part, 0)
  full = tuple(jnp.zeros((rows, *o.shape[1:]), o.dtype) for o in outs)

  def body(c, bufs):
    start = jnp.minimum(c * per, rows - per)  # the last slice ends at `rows`: rows drawn twice are equal
    return tuple(jax.lax.dynamic_update_slice_in_dim(b, v, start, 0) for b, v in zip(bufs, part(start)))

  got = jax.lax.fori_loop(0, -(-rows // per), body, full)
  return got if blocks else got[0]


def make_inputs(p: Problem, group_sizes=None, salt: str = "inputs") -> dict[str, jax.Array]:
  """Fresh random lhs, rhs, dout (never zeros), scaled so outputs stay O(1), drawn on the
  device in their own dtype a slice at a time (_draw): the same values for the same problem
  and salt. A quantized format's operands come quantized, with their scales (quantized_inputs);
  a training format's dlhs and drhs take float ones (trained_inputs)."""
  key = jax.random.key(_seed(p, salt))
  keys = jax.random.split(key, 3)
  gs = np.asarray(p.group_sizes if group_sizes is None else group_sizes, np.int32)
  specs = draws(p)
  drawn = dict(zip(specs, _draw_all(keys[: len(specs)], tuple(specs.values()), DRAW_CHUNK)))
  if trained(p.op, p.dtype):
    return trained_inputs(p, drawn, keys[2], gs)
  if scheme(p.dtype):
    return quantized_inputs(p, drawn, keys[2], gs)
  return {**drawn, "group_sizes": jnp.asarray(gs)}


def draws(p: Problem) -> dict[str, tuple]:
  """The operands make_inputs draws: name -> _draw's arguments after the key. rhs is divided
  by sqrt(k), so the outputs' size does not grow with k."""
  rhs = (p.g, p.k, p.n)
  if trained(p.op, p.dtype):  # the two operands of the op, in a model's float dtype
    drawn = {
      "lhs": ((p.m, p.k), TRAINED_DTYPE, 1.0, None, False),
      "rhs": (rhs, TRAINED_DTYPE, float(np.sqrt(p.k)), None, False),
      "dout": ((p.m, p.n), TRAINED_DTYPE, 1.0, None, False),
    }
    return {name: drawn[name] for name in (("dout", "rhs") if p.op == "dlhs" else ("lhs", "dout"))}
  if scheme(p.dtype):
    dtype, (lhs_block, rhs_block) = element_dtype(p.dtype), quant.operand_blocks(p.dtype)
    return {
      "lhs": ((p.m, p.k), dtype, 1.0, lhs_block, False),
      "rhs": (rhs, dtype, float(np.sqrt(p.k)), rhs_block, QUANTIZED_RHS_NK),
    }
  return {
    "lhs": ((p.m, p.k), p.dtype, 1.0, None, False),
    "rhs": (rhs, p.dtype, float(np.sqrt(p.k)), None, False),
    "dout": ((p.m, p.n), p.dtype, 1.0, None, False),
  }


# Quantized problems are tuned with weights stored [g, n, k] and read with transpose_rhs: the
# layout of a checkpoint's nn.Linear expert weights, which a serving model passes as they
# are, and the only one Hopper's 8-bit wgmma reads without a copy (docs/quantization.md).
QUANTIZED_RHS_NK = True


def quantized_inputs(p: Problem, drawn: dict, key, gs: np.ndarray) -> dict[str, jax.Array]:
  """Normal lhs and rhs quantized to p's format (drawn: kernels.quant.quantize, a slice of rows
  or experts at a time), then the scales of each group times 2^u and of each row times 2^v (u
  in [-6, 6], v in [-3, 3], integers): outputs that differ by 10^4 between experts, as real
  checkpoints' do, so a kernel that reads another group's or row's scale is caught (the values
  stay as quantized; a power of two changes no rounding). The weights are stored [g, n, k]
  (QUANTIZED_RHS_NK)."""
  (lq, ls), (rq, rs) = drawn["lhs"], drawn["rhs"]
  ku, kv = jax.random.split(key)
  group_exp = jax.random.randint(ku, (p.g, 1, 1), -6, 7).astype(jnp.float32)
  row_exp = jax.random.randint(kv, (p.m, 1), -3, 4).astype(jnp.float32)
  return {
    "lhs": lq,
    "rhs": rq,
    "lhs_scale": ls * jnp.exp2(row_exp),
    "rhs_scale": rs * jnp.exp2(group_exp),
    "group_sizes": jnp.asarray(gs),
  }


# A training format's dlhs and drhs take float operands, as a model trains in; ragged_dot's
# quantize= quantizes them on each call (kernels.ragged_dot.train_op), weights [g, k, n].
TRAINED_DTYPE = "bfloat16"


def trained_inputs(p: Problem, drawn: dict, key, gs: np.ndarray) -> dict[str, jax.Array]:
  """Float operands of a training format's dlhs or drhs, each row (and each group's weights)
  times 2^v (v in [-3, 3]; weights 2^u, u in [-6, 6]): block scales that differ by row, token
  block and expert, so a kernel that reads another block's scale is caught. Powers of two
  are exact in bfloat16."""
  ku, kv, kw = jax.random.split(key, 3)
  spread = {
    "lhs": jax.random.randint(kv, (p.m, 1), -3, 4),
    "dout": jax.random.randint(kw, (p.m, 1), -3, 4),
    "rhs": jax.random.randint(ku, (p.g, 1, 1), -6, 7),
  }
  out = {name: (a * jnp.exp2(spread[name].astype(jnp.float32))).astype(a.dtype) for name, a in drawn.items()}
  if p.op == "dlhs":  # training's dlhs reads the weights the forward quantized (both layouts)
    tw = quant.training_weights(out["rhs"], p.dtype)
    out["rhs"], out["rhs_scale"], out["rhs_other"] = tw.values, tw.scales, tw.other
  return {**out, "group_sizes": jnp.asarray(gs)}


def op_args(op: str, x: dict[str, jax.Array]) -> tuple:
  if "lhs_scale" in x:  # quantized operands: forward only
    return (x["lhs"], x["rhs"], x["group_sizes"], x["lhs_scale"], x["rhs_scale"])
  if op == "fwd":
    return (x["lhs"], x["rhs"], x["group_sizes"])
  if op == "dlhs" and "rhs_scale" in x:  # fp8 training: the forward's quantized weights
    return (x["dout"], x["rhs"], x["group_sizes"], x["rhs_scale"], x["rhs_other"])
  if op == "dlhs":
    return (x["dout"], x["rhs"], x["group_sizes"])
  return (x["lhs"], x["dout"], x["group_sizes"])


@dataclasses.dataclass(frozen=True)
class Expected:
  """The reference result (float32, on the device), and for a quantized format the elementwise
  bound on a kernel's error beyond rtol * |value| (kernels.quant.Tolerance, in float32, on the
  device): None judges by numerics.TOLERANCE."""

  value: jax.Array
  atol: jax.Array | None = None
  rtol: float | None = None


@functools.partial(jax.jit, donate_argnums=0)
def _bound(squares, gamma):
  """gamma * sqrt(squares), in the squares' buffer."""
  return gamma * jnp.sqrt(squares)


def reference(op: str, x: dict[str, jax.Array], out_dtype=jnp.bfloat16, fmt: str = "") -> Expected:
  """jax.lax.ragged_dot (or its vjp) in float32 at HIGHEST precision, on the device; for
  quantized operands that of the dequantized operands (kernels.quant.reference), with the
  bound of kernels.quant.tolerance for an output in out_dtype; for a training format's dlhs
  or drhs (fmt, the problem's format) that of the operands as train_op quantizes them
  (trained_reference). Computed group by group (kernels.reference), so its memory is the
  operands' and its float32 output's, and its FLOPs near the problem's, where lax's own
  lowering takes g times both; refused (reference.DoesNotFit) where even that needs more than
  the device's memory."""
  memory = limits.device_memory_bytes()
  if trained(op, fmt):
    return trained_reference(op, x, fmt, out_dtype, memory)
  if "lhs_scale" in x:
    layout = dict(transpose_rhs=QUANTIZED_RHS_NK)
    fmt = quant.check(x["lhs"], x["rhs"], x["lhs_scale"], x["rhs_scale"], **layout)
    args = (x["lhs"], x["rhs"], x["group_sizes"], x["lhs_scale"], x["rhs_scale"])
    value, squares = lax_reference.quantized(*args, memory=memory, **layout)
    return bounded(value, squares, fmt, x["lhs"].shape[1], out_dtype)
  return Expected(lax_reference.ragged_dot(op, x["lhs"], x["rhs"], x["dout"], x["group_sizes"], memory=memory))


def bounded(value, squares, fmt: str, contraction, out_dtype) -> Expected:
  """The rule a quantized result is judged by, elementwise: |out - ref| <= rtol |ref| +
  gamma e (kernels.quant.tolerance of the contraction's length; e = sqrt(squares), the size
  of the products each output sums). contraction: one length, or one per group of a drhs
  (an array that broadcasts over [g, k, n])."""
  gamma = np.vectorize(lambda c: quant.tolerance(fmt, int(c), out_dtype).gamma, otypes=[np.float32])(contraction)
  rtol = quant.tolerance(fmt, 1, out_dtype).rtol  # the output's rounding, whatever the length
  return Expected(value, _bound(squares, gamma), rtol)


def trained_reference(op: str, x: dict[str, jax.Array], fmt: str, out_dtype, memory: int | None) -> Expected:
  """A training format's dlhs or drhs, judged as its forward is: the float32 ragged_dot of the
  operands quantized as kernels.ragged_dot.train_op quantizes them (the values and scales its
  kernel gets), dequantized, and the bound of kernels.quant.tolerance over the contraction:
  n for dlhs (dout in 1x128 blocks along n times the weights' 128x128 blocks, read
  transposed), a group's 128-token blocks for drhs (lhs and dout in 128x1 blocks per group,
  quant.token_blocks). A kernel that reads another block's values or scales is off by a share
  of e far above gamma."""
  gs = x["group_sizes"]
  if op == "dlhs":
    dq, rq, ds, rs = _quantized_dlhs(x["dout"], x["rhs"], x["rhs_scale"], fmt=fmt)
    value, squares = lax_reference.quantized(dq, rq, gs, ds, rs, transpose_rhs=True, memory=memory)
    return bounded(value, squares, fmt, x["dout"].shape[1], out_dtype)
  g, k, n = gs.shape[0], x["lhs"].shape[1], x["dout"].shape[1]
  a, b, count = _dequantized_tokens(x["lhs"], x["dout"], gs, fmt=fmt, g=g)
  count = jax.device_get(count)
  value, squares = lax_reference.token_contraction(a, b, count * quant.BLOCK, (g, k, n), memory=memory)
  return bounded(value, squares, fmt, (count * quant.BLOCK)[:, None, None], out_dtype)


@functools.partial(jax.jit, static_argnames=("fmt",))
def _quantized_dlhs(dout, rq, rs, *, fmt: str):
  """train_op's dlhs operands: dout in 1x128 blocks along n, and the quantized weights read as
  [g, n, k] (transpose_rhs), their scales in that frame."""
  dq, ds = quant.quantize(dout, element_dtype(fmt), (1, quant.BLOCK))
  return dq, rq, ds, rs.swapaxes(1, 2)


@functools.partial(jax.jit, static_argnames=("fmt", "g"))
def _dequantized_tokens(lhs, dout, group_sizes, *, fmt: str, g: int):
  """train_op's drhs operands in float32, on the padded token axis (quant.token_blocks):
  lhs [T, k] and dout [T, n], each 128x1 block's values times its scale; and each group's
  count of blocks. One program: eager ops dispatched while an interpreted kernel is still in
  flight deadlocked XLA:CPU (jax 0.12's Mosaic GPU interpreter, verify's worker)."""
  blocks = quant.token_blocks(group_sizes, lhs.shape[0], None, g)

  def dequantized(x):
    q, s = quant.quantize_tokens(x, blocks, element_dtype(fmt))  # [c, T], [T / 128, c]
    c, t = q.shape
    return (q.astype(jnp.float32).reshape(c, t // quant.BLOCK, quant.BLOCK) * s.T[:, :, None]).reshape(c, t).T

  return dequantized(lhs), dequantized(dout), blocks.count


def out_dtype(p: Problem):
  """The output dtype a problem is tuned for: its operands', bfloat16 for a quantized format."""
  return jnp.bfloat16 if scheme(p.dtype) else jnp.dtype(p.dtype)


def build_op(p: Problem, backend: str, config, interpret: bool) -> Callable[..., jax.Array]:
  """The callable that runs `p.op` with `config`, taking op_args(p.op, ...)."""
  common = dict(
    backend=backend,
    config=config,
    out_dtype=out_dtype(p),
    interpret=interpret and registry.get(backend).config_type is not None,
  )
  if trained(p.op, p.dtype):  # float operands, quantized as fp8 training does
    kw = dict(fmt=p.dtype, **common)
    if p.op == "dlhs":
      return lambda d, b, gs, s, o: train_op("dlhs", d, b, gs, rhs_scale=s, rhs_other=o, **kw)
    return lambda a, d, gs: train_op("drhs", a, d, gs, num_groups=p.g, **kw)
  if scheme(p.dtype):
    return lambda a, b, gs, ls, rs: forward(
      a, b, gs, lhs_scale=ls, rhs_scale=rs, transpose_rhs=QUANTIZED_RHS_NK, **common
    )
  if p.op == "fwd":
    return lambda a, b, gs: forward(a, b, gs, **common)
  if p.op == "dlhs":
    return lambda d, b, gs: grad_lhs(d, b, gs, **common)
  return lambda a, d, gs: grad_rhs(a, d, gs, num_groups=p.g, **common)


def dense_args(p: Problem, x: dict[str, jax.Array]) -> tuple:
  """Dense operands with the same FLOPs as the problem: rows = sum(group_sizes). Quantized
  operands' values as they are (dense_matmul takes them to f32 accumulation)."""
  rows = max(1, int(sum(p.group_sizes)))
  a = x["lhs"][:rows] if p.op != "dlhs" else x["dout"][:rows]
  b = x["rhs"][0] if p.op == "fwd" else (x["rhs"][0].T if p.op == "dlhs" else x["dout"][:rows])
  if "lhs_scale" in x and QUANTIZED_RHS_NK:  # weights stored [g, n, k]
    b = x["rhs"][0].T
  if p.op == "drhs":
    a = a.T  # [k, rows] x [rows, n]
  return (jnp.asarray(a), jnp.asarray(b))


def dense_matmul(a, b):
  out = jnp.float32 if jnp.dtype(a.dtype).itemsize == 1 else a.dtype  # no fp8/int8 output
  return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(out)


def flops(p: Problem) -> float:
  return 2.0 * sum(p.group_sizes) * p.k * p.n


def bytes_moved(p: Problem) -> float:
  """The bytes any implementation must move: fwd and dlhs read the weights of the groups
  that hold rows (an empty expert's need not be read); drhs writes every group's gradient."""
  # quantized outputs are wider; their scales are small: a lower bound. fp8 training's
  # gradients read their float activations once, to quantize them.
  b = itemsize(TRAINED_DTYPE if trained(p.op, p.dtype) else p.dtype)
  used = sum(1 for s in p.group_sizes if s > 0)
  io = {
    "fwd": used * p.k * p.n + p.m * p.k + p.m * p.n,
    "dlhs": used * p.k * p.n + p.m * p.n + p.m * p.k,
    "drhs": p.m * p.k + p.m * p.n + p.g * p.k * p.n,
  }[p.op]
  if trained(p.op, p.dtype) and p.op == "dlhs":  # the weights come quantized (1 byte), the rest float
    return float(used * p.k * p.n * itemsize(p.dtype) + b * (p.m * p.n + p.m * p.k))
  return float(b * io)


def dense_bytes(args: tuple) -> float:
  """Bytes of a dense matmul's operands and its [rows, cols] output (dense_args)."""
  a, b = args
  return float(a.nbytes + b.nbytes + a.shape[0] * b.shape[1] * a.dtype.itemsize)


def compile_fn(fn: Callable, args: tuple):
  return jax.jit(fn).lower(*args).compile()


def error_text(e: BaseException, limit: int = 500) -> str:
  """One line, at most `limit` characters, for the row's error field. A long message keeps
  its start and its end, where a wrapped traceback puts the original error."""
  text = " ".join(f"{type(e).__name__}: {e}".strip().splitlines())
  if len(text) <= limit:
    return text
  return text[:150] + " … " + text[-(limit - 153) :]


def check(p: Problem, out, ref: Expected) -> NumericsResult:
  """The kernel's output against the reference, on the device (numerics.compare)."""
  if ref.atol is not None:
    return compare(ref.value, out, rtol=ref.rtol, atol=ref.atol)
  return compare(ref.value, out, rtol=TOLERANCE[p.dtype])


# --- timing ---------------------------------------------------------------------------


def _wallclock_median(fn: Callable, args: tuple, warmup: int, iters: int) -> float:
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(iters):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def _tune_jax_times(fns: dict[str, tuple[Callable, tuple, Any]], samples: int | None = None) -> dict[str, float]:
  """Device time of each variant from profiler events, all in one tune-jax run: one profile
  per sample, each running every variant once; the mean without the extremes of each.

  tune-jax quietly falls back to host timing when the profiler yields nothing; that is made
  an error here, so the caller's fallback can say which clock ran and why."""
  import logging
  import math

  import tune_jax

  tune_jax.logger.setLevel(logging.ERROR)
  names = list(fns)
  flat_args = tuple(a for name in names for a in fns[name][1])
  spans, pos = {}, 0
  for name in names:
    spans[name] = (pos, pos + len(fns[name][1]))
    pos = spans[name][1]

  def run(*args, variant):
    fn = fns[variant][0]
    lo, hi = spans[variant]
    return fn(*args[lo:hi])

  cfg = tune_jax.CONFIG
  saved = (cfg.allow_fallback_timing, cfg.profiling_samples)
  cfg.allow_fallback_timing, cfg.profiling_samples = False, samples or cfg.profiling_samples
  try:
    tuned = tune_jax.tune(run, hyperparams={"variant": names}, example_args=flat_args)
    tuned(*flat_args)
  finally:
    cfg.allow_fallback_timing, cfg.profiling_samples = saved
  times = {r.hyperparams["variant"]: float(r.t_mean) for _, r in tuned.timing_results.items()}
  unseen = [n for n in names if not math.isfinite(times.get(n, math.inf)) or times[n] <= 0]
  if unseen:
    raise RuntimeError(f"no profiler events for {unseen}")
  return times


def time_variants(
  fns: dict[str, tuple[Callable, tuple, Any]],
  *,
  on_device: bool,
  warmup: int = 1,
  iters: int = 3,
  samples: int | None = None,
) -> tuple[dict[str, float], str]:
  """Seconds per call of each named (fn, args, compiled), all measured in the same run.

  The second value names the timer. On a device it is "tune-jax"; if the profiler path
  fails there, it is the wall-clock label followed by the reason, so no row hides a fallback."""
  fallback = ""
  if on_device:
    try:
      return _tune_jax_times(fns, samples), "tune-jax" if samples is None else f"tune-jax(samples={samples})"
    except Exception as e:  # noqa: BLE001 - fall back to the host clock, and say why
      # tune-jax re-raises a generic "prohibits it" error inside its except: the cause is the context.
      cause = e.__context__ if "prohibits it" in str(e) and e.__context__ is not None else e
      fallback = f"; tune-jax failed: {error_text(cause, 200)}"
  return (
    {name: _wallclock_median(compiled, args, warmup, iters) for name, (_, args, compiled) in fns.items()},
    f"wallclock-median(warmup={warmup},iters={iters}){fallback}",
  )
