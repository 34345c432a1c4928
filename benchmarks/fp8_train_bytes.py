"""What an fp8 training step moves outside its matmul kernels: the bytes of every other kernel
(the quantization passes, copies and small fusions) in the program XLA builds for a GPU,
read from the optimized HLO (each top-level kernel's operands and outputs, once). A CPU host
runs it: the program is compiled deviceless (ragtune.deviceless.aot). A model of the traffic,
not a measurement of time.

  python benchmarks/fp8_train_bytes.py                 # DeepSeek-V3 up and down, on an H100
  python benchmarks/fp8_train_bytes.py --target b200

Three forms of the step (jax.vjp of kernels.ragged_dot(x, w, quantize=...)): the activation
passes as single-pass kernels where the device has them (registry.activation_quantizer, the
default), as XLA's passes, and with the weights quantized once per optimizer step
(rhs_quantized; that pass then runs once a step, not once a call).
"""

import argparse
import re
import sys
from contextlib import contextmanager
from unittest import mock

import jax
import jax.numpy as jnp

import kernels
from kernels import quant, registry
from ragtune.deviceless import aot

SIZE = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "f8e4m3fn": 1, "s8": 1, "u8": 1, "pred": 1}
SHAPE = re.compile(r"\b(" + "|".join(SIZE) + r")\[([\d,]*)\]")
FMT = "float8_e4m3fn:block128"
PROBLEMS = {
  # name: (m, k, n, g): the anchors (one layer's tokens and experts), and one device's share
  # under 32-way expert parallelism (8 experts, the same tokens per expert).
  "DeepSeek-V3 up": (131072, 7168, 2048, 256),
  "DeepSeek-V3 down": (131072, 2048, 7168, 256),
  "DeepSeek-V3 up, 8 experts": (4096, 7168, 2048, 8),
  "DeepSeek-V3 down, 8 experts": (4096, 2048, 7168, 8),
}


def nbytes(text: str) -> int:
  total = 0
  for dt, dims in SHAPE.findall(text):
    n = 1
    for d in filter(None, dims.split(",")):
      n *= int(d)
    total += n * SIZE[dt]
  return total


def kernel_bytes(hlo: str) -> tuple[int, int]:
  """(bytes of the matmul kernels, bytes of every other kernel) of the entry computation."""
  entry = hlo[hlo.index("\nENTRY") :]
  entry = entry[: entry.index("\n}")]
  shapes, matmul, other = {}, 0, 0
  for line in entry.splitlines()[1:]:
    line = re.sub(r", metadata=.*", "", line.strip())
    m = re.match(r"(ROOT )?%(\S+) = (.+?) (\w[\w-]*)\((.*?)\)", line)
    if not m:
      continue
    name, out, op, args = m.group(2), m.group(3), m.group(4), m.group(5)
    shapes[name] = nbytes(out.split(" ")[0] if not out.startswith("(") else out[: out.index(")") + 1])
    if op in ("fusion", "custom-call", "copy", "transpose"):
      moved = shapes[name] + sum(shapes.get(a.strip().lstrip("%"), 0) for a in args.split(","))
      # The matmuls: Mosaic GPU's custom calls and the Triton gmm/tgmm (not the quantizers).
      is_matmul = "mosaic_gpu" in line or re.search(r"ragtune_(gmm|tgmm)", line)
      matmul, other = (matmul + moved, other) if is_matmul else (matmul, other + moved)
  return matmul, other


@contextmanager
def xla_passes():
  with mock.patch.object(registry, "activation_quantizer", lambda *a: None):
    yield


def step_bytes(target: str, m: int, k: int, n: int, g: int, cached: bool) -> tuple[int, int]:
  mesh, _ = aot.target_mesh(target)
  from jax.sharding import NamedSharding, PartitionSpec

  def sds(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, PartitionSpec()))

  gs = sds((g,), jnp.int32)

  def step(x, w, sizes, dout, *copy):
    kw = dict(quantize=FMT, rhs_quantized=quant.TrainingWeights(*copy, False) if copy else None)
    out, vjp = jax.vjp(lambda a, b: kernels.ragged_dot(a, b, sizes, **kw), x, w)
    return out, vjp(dout)

  bf = jnp.bfloat16
  args = [sds((m, k), bf), sds((g, k, n), bf), gs, sds((m, n), bf)]
  if cached:  # quant.training_weights: values, scales, the values in the other layout
    kb, nb = -(-k // quant.BLOCK), -(-n // quant.BLOCK)
    args += [sds((g, k, n), jnp.float8_e4m3fn), sds((g, kb, nb), jnp.float32), sds((g, n, k), jnp.float8_e4m3fn)]
  with jax.set_mesh(mesh):
    hlo = jax.jit(step).lower(*args).compile().as_text()
  return kernel_bytes(hlo)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--target", default="h100")
  args = p.parse_args(argv)
  print(f"target {args.target} ({aot.device_kind(args.target)}), jax {jax.__version__}; bytes read from the HLO")
  print(
    "| problem | matmul kernels | passes: single-pass | passes: XLA's | weights quantized once | x, w, dout (bf16) |"
  )
  print("|---|---:|---:|---:|---:|---:|")
  for name, (m, k, n, g) in PROBLEMS.items():
    matmul, fused = step_bytes(args.target, m, k, n, g, cached=False)
    with xla_passes():
      _, xla = step_bytes(args.target, m, k, n, g, cached=False)
    _, once = step_bytes(args.target, m, k, n, g, cached=True)
    inputs = 2 * (m * k + g * k * n + m * n)
    gb = lambda b: f"{b / 1e9:.2f} GB"
    print(f"| {name} [{m},{k}]x[{g},{k},{n}] | {gb(matmul)} | {gb(fused)} | {gb(xla)} | {gb(once)} | {gb(inputs)} |")
    sys.stdout.flush()


if __name__ == "__main__":
  main()
