"""Benchmark kernels.ragged_dot (LUT or default config) against XLA ragged_dot and a dense
matmul of the same FLOPs, on one shape, with multinomial group sizes. Prints a table.

  python benchmarks/bench_ragged_dot.py                       # GPU/TPU: [8192,4096]x[8,4096,14336] bf16
  python benchmarks/bench_ragged_dot.py --m 512 --k 256 --n 512 --g 8

Timing is tune-jax (device profiler events, concrete inputs) on an accelerator and a
wall-clock median on a CPU host. On a CPU host the Pallas kernel (pallas_gpu unless
--backend says otherwise) runs in interpret mode, labelled as such: its time is the
interpreter's, beside XLA's compiled CPU time, and says nothing about GPU speed. The
default shape there is a small one, as interpret mode is slow.
"""

import argparse
import dataclasses

import jax

import kernels
from kernels.ragged_dot import default_interpret, resolve
from ragtune.device import measure
from ragtune.problems.shapes import GroupDist, Problem

DEVICE_SHAPE = (8192, 4096, 14336, 8)
CPU_SHAPE = (256, 128, 256, 8)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  for dim in ("m", "k", "n", "g"):
    ap.add_argument(f"--{dim}", type=int, default=None)
  ap.add_argument("--dtype", default="bfloat16")
  ap.add_argument("--op", default="fwd", choices=kernels.common.OPS)
  ap.add_argument("--backend", default="auto", help="auto: the fallback for --op here; pallas_gpu on a CPU host")
  ap.add_argument(
    "--bands",
    default="",
    help="pallas_gpu: also time the config with these launch bands (group_m; group_k for drhs), "
    "e.g. 1,16,1024 to compare launch orders side by side (a config of another backend, such as "
    "auto's mosaic_gpu drhs on Hopper, is timed alone)",
  )
  ap.add_argument("--warmup", type=int, default=3)
  ap.add_argument("--iters", type=int, default=20)
  args = ap.parse_args(argv)

  on_device = jax.default_backend() != "cpu"
  dev = kernels.target.current()
  # A quantized format: a backend that computes it here; a plain dtype: the op's fallback.
  auto = kernels.registry.auto_backend(dev.platform, dev.device_kind, args.dtype, op=args.op)
  backend = auto if args.backend == "auto" else args.backend
  if args.backend == "auto" and backend == kernels.registry.REFERENCE:
    backend = kernels.registry.tunable()[0]  # a CPU host: still time a Pallas kernel (interpreted), not XLA against XLA
  interpret = default_interpret(backend)
  default = DEVICE_SHAPE if on_device else CPU_SHAPE
  m, k, n, g = (getattr(args, d) or v for d, v in zip("mkng", default))
  sizes = GroupDist(dist="multinomial", seed=0).draw(m, g)
  p = Problem(args.op, backend, args.dtype, m, k, n, g, "multinomial(seed=0)", tuple(int(s) for s in sizes))
  x = measure.make_inputs(p)
  a = measure.op_args(p.op, x)
  choice = resolve(None, backend, p.m, p.k, p.n, p.g, p.dtype)[p.op]
  mode = "INTERPRET mode, CPU emulation: not GPU/TPU speed" if interpret else "compiled"
  name = f"{backend} [{mode}]" if backend != kernels.registry.REFERENCE else f"{backend} (kernels.ragged_dot)"
  variants = {name: (measure.build_op(p, backend, choice.config, interpret), a)}
  if args.bands and isinstance(choice.config, kernels.TritonConfig):
    knob = "group_k" if p.op == "drhs" else "group_m"
    for band in (int(b) for b in args.bands.split(",")):
      cfg = dataclasses.replace(choice.config, **{knob: band})
      if cfg != choice.config:
        variants[f"{name} {knob}={band}"] = (measure.build_op(p, backend, cfg, interpret), a)
  variants.update(
    {
      "xla ragged_dot": (measure.build_op(p, kernels.registry.REFERENCE, None, False), a),
      "dense matmul, same FLOPs": (measure.dense_matmul, measure.dense_args(p, x)),
    }
  )
  fns = {v: (fn, args_, measure.compile_fn(fn, args_)) for v, (fn, args_) in variants.items()}
  out = jax.block_until_ready(fns[name][2](*a))
  res = measure.check(p, out, measure.reference(p.op, x))
  times, timer = measure.time_variants(fns, on_device=on_device, warmup=args.warmup, iters=args.iters)
  dev = jax.devices()[0]
  print(f"device: {dev.device_kind} ({dev.platform}), jax {jax.__version__}, timer: {timer}")
  if interpret:
    print(
      f"NOTE: no {backend} hardware here, so {backend} runs in Pallas interpret mode; its time is the "
      "interpreter's; the XLA and dense rows are real CPU timings."
    )
  print(f"problem: {p.op} {p.shape_label} {p.dtype}, group sizes {list(p.group_sizes)[:8]}...")
  print(f"config: {choice}")
  print(f"check vs lax: {res.summary()}")
  width = max(34, max(len(v) for v in times) + 2)
  print(f"{'variant':<{width}}{'ms':>10}{'TF/s':>10}{'GB/s':>10}")
  for v, t in times.items():
    print(f"{v:<{width}}{t * 1e3:>10.3f}{measure.flops(p) / t / 1e12:>10.3g}{measure.bytes_moved(p) / t / 1e9:>10.3g}")


if __name__ == "__main__":
  main()
