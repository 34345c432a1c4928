"""Every Pallas GPU kernel variant lowers to a Triton custom call for CUDA, checked on a CPU host."""

import importlib
import warnings

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractDevice, AbstractMesh, AxisType

import kernels
from kernels.pallas_gpu import gmm as gpu_gmm
from kernels.pallas_gpu import tgmm as gpu_tgmm

S = jax.ShapeDtypeStruct
TRITON = "__gpu$xla.gpu.triton"


def export_for_h100(f, *args):
  dev = AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=None, platform="cuda")
  mesh = AbstractMesh((1,), ("x",), axis_types=(AxisType.Auto,), abstract_device=dev)
  with jax.sharding.use_abstract_mesh(mesh):
    exp = jax.export.export(
      jax.jit(f), platforms=["cuda"], disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(TRITON)]
    )(*args)
  return exp.mlir_module()


CONFIGS = [
  kernels.TritonConfig(64, 32, 64, 4, 3, group_m=1, group_k=3),
  kernels.TritonConfig(128, 64, 128, 8, 4, group_m=64, group_k=1),
  kernels.TritonConfig(16, 16, 16, 1, 1),
]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize(
  "cfg", CONFIGS, ids=lambda c: f"{c.block_m}x{c.block_k}x{c.block_n}w{c.num_warps}s{c.num_stages}"
)
def test_gmm_and_tgmm_lower_to_triton(cfg, dtype):
  m, k, n, g = 300, 72, 200, 5
  gs = S((g,), jnp.int32)
  mods = [
    export_for_h100(
      lambda x, w, s: gpu_gmm.gmm(x, w, s, config=cfg, out_dtype=dtype), S((m, k), dtype), S((g, k, n), dtype), gs
    ),
    export_for_h100(
      lambda x, w, s: gpu_gmm.gmm(x, w, s, config=cfg, out_dtype=dtype, transpose_rhs=True),
      S((m, k), dtype),
      S((g, n, k), dtype),
      gs,
    ),
    export_for_h100(
      lambda x, d, s: gpu_tgmm.tgmm(x, d, s, num_groups=g, config=cfg, out_dtype=dtype),
      S((m, k), dtype),
      S((m, n), dtype),
      gs,
    ),
  ]
  for mod in mods:
    assert mod.count(TRITON) == 1


def test_full_vjp_with_group_offset_lowers_to_triton():
  m, k, n, g = 128, 64, 96, 4

  def loss(x, w, s, off):
    y = kernels.ragged_dot(x, w, s, backend="pallas_gpu", group_offset=off, interpret=False)
    return jnp.sum(y.astype(jnp.float32) ** 2)

  mod = export_for_h100(
    jax.grad(loss, argnums=(0, 1)),
    S((m, k), jnp.bfloat16),
    S((g, k, n), jnp.bfloat16),
    S((8,), jnp.int32),
    S((), jnp.int32),
  )
  assert mod.count(TRITON) == 3  # fwd gmm, dlhs gmm (transposed read), drhs tgmm


def test_upstream_deprecation_is_one_warning_a_process(monkeypatch):
  """jax >= 0.11 deprecates Pallas Triton and warns at every Triton lowering (three a vjp);
  the backend warns once a process instead, and explain names the deprecation."""
  upstream = importlib.import_module("kernels.pallas_gpu.upstream")
  monkeypatch.setattr(upstream, "_warned", False)
  why = upstream.deprecated()
  assert bool(why) == (jax.__version_info__ >= (0, 11))

  def loss(x, w, s):
    return jnp.sum(kernels.ragged_dot(x, w, s, backend="pallas_gpu", interpret=False).astype(jnp.float32) ** 2)

  args = (S((128, 64), jnp.bfloat16), S((4, 64, 96), jnp.bfloat16), S((4,), jnp.int32))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(2):
      assert export_for_h100(jax.grad(loss, argnums=(0, 1)), *args).count(TRITON) == 3
  triton = [str(w.message) for w in caught if "Triton" in str(w.message)]
  assert triton == ([f"kernels backend 'pallas_gpu': {why}"] if why else [])
  with warnings.catch_warnings(record=True) as caught:  # a kernel called directly, as the tests do
    warnings.simplefilter("always")
    export_for_h100(lambda x, w, s: gpu_gmm.gmm(x, w, s, config=CONFIGS[0], out_dtype=jnp.bfloat16), *args)
  assert not [w for w in caught if "Triton" in str(w.message)]
  marker = " (deprecated upstream)" if why else ""
  for op, choice in kernels.explain((128, 64), (4, 64, 96), jnp.bfloat16, backend="pallas_gpu").items():
    assert str(choice).startswith(f"{op}: pallas_gpu{marker} "), choice


@pytest.mark.parametrize("device_kind", ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L4"])
@pytest.mark.parametrize("op", ["fwd", "dlhs", "drhs"])
def test_family_defaults_lower_on_block_multiples(device_kind, op):
  """Each device family's default, on dims that are block multiples (the unmasked fast path)."""
  m, k, n, g = 1024, 512, 768, 4
  cfg = kernels.registry.default_config("pallas_gpu", op, "bfloat16", m, k, n, g, device_kind=device_kind)
  assert cfg.fits(op, "bfloat16", m, k, n, device_kind)
  bf, gs = jnp.bfloat16, S((g,), jnp.int32)
  if op == "drhs":
    mod = export_for_h100(
      lambda x, d, s: gpu_tgmm.tgmm(x, d, s, num_groups=g, config=cfg, out_dtype=bf), S((m, k), bf), S((m, n), bf), gs
    )
  elif op == "dlhs":
    mod = export_for_h100(
      lambda d, w, s: gpu_gmm.gmm(d, w, s, config=cfg, out_dtype=bf, transpose_rhs=True),
      S((m, n), bf),
      S((g, k, n), bf),
      gs,
    )
  else:
    mod = export_for_h100(
      lambda x, w, s: gpu_gmm.gmm(x, w, s, config=cfg, out_dtype=bf), S((m, k), bf), S((g, k, n), bf), gs
    )
  assert mod.count(TRITON) == 1
