"""Benchmark kernels.ragged_dot (default or LUT config) against XLA ragged_dot and a dense
matmul of the same FLOPs, on one shape, with multinomial group sizes. Prints a table.

  python benchmarks/bench_ragged_dot.py                       # [8192,4096]x[8,4096,14336] bf16
  python benchmarks/bench_ragged_dot.py --m 512 --k 256 --n 512 --g 8   # small (CPU: interpret)

Timing is tune-jax (device profiler events, concrete inputs) on an accelerator and a
wall-clock median on a CPU host, where Pallas runs interpreted and figures mean nothing.
"""

import argparse

import jax

import kernels
from ragtune import measure
from ragtune.shapes import GroupDist, Problem


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--m", type=int, default=8192)
  ap.add_argument("--k", type=int, default=4096)
  ap.add_argument("--n", type=int, default=14336)
  ap.add_argument("--g", type=int, default=8)
  ap.add_argument("--dtype", default="bfloat16")
  ap.add_argument("--op", default="fwd", choices=kernels.OPS)
  ap.add_argument("--backend", default="auto")
  args = ap.parse_args()

  backend = kernels.resolve_backend(args.backend)
  on_device = jax.default_backend() != "cpu"
  sizes = GroupDist(dist="multinomial", seed=0).draw(args.m, args.g)
  p = Problem(args.op, backend, args.dtype, args.m, args.k, args.n, args.g, "multinomial(seed=0)",
              tuple(int(s) for s in sizes))
  x = measure.make_inputs(p)
  a = measure.op_args(p.op, x)
  cfg = kernels.select_config(p.op, backend, p.m, p.k, p.n, p.g, p.dtype)
  variants = {
      f"{backend} ({'LUT/default' if cfg else 'xla'})": (measure.build_op(p, backend, cfg, not on_device), a),
      "xla ragged_dot": (measure.build_op(p, "xla", None, False), a),
      "dense matmul, same FLOPs": (measure.dense_matmul, measure.dense_args(p, x)),
  }
  fns = {name: (fn, args_, measure.compile_fn(fn, args_)) for name, (fn, args_) in variants.items()}
  out = jax.block_until_ready(fns[next(iter(fns))][2](*a))
  res = measure.check(p, out, measure.reference(p.op, x))
  times, timer = measure.time_variants(fns, on_device=on_device, warmup=3, iters=20)
  dev = jax.devices()[0]
  print(f"device: {dev.device_kind} ({dev.platform}), jax {jax.__version__}, timer: {timer}")
  print(f"problem: {p.op} {p.shape_label} {p.dtype}, group sizes {list(p.group_sizes)[:8]}...")
  print(f"config: {cfg}")
  print(f"check vs lax: {res.summary()}")
  print(f"{'variant':<34}{'ms':>10}{'TF/s':>10}{'GB/s':>10}")
  for name, t in times.items():
    print(f"{name:<34}{t * 1e3:>10.3f}{measure.flops(p) / t / 1e12:>10.1f}{measure.bytes_moved(p) / t / 1e9:>10.1f}")


if __name__ == "__main__":
  main()
