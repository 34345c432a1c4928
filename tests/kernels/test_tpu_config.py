"""The TPU chips (kernels/common.py), the static VMEM rule and the default's rule
(kernels/pallas_tpu/config.py). What the compiler says of them is in tests/ragtune/test_aot_tpu.py."""

import itertools

import pytest

from kernels import common
from kernels.pallas_tpu import config as tpu
from kernels.pallas_tpu.config import TpuConfig

MIB = 1 << 20
# Forward problems (m, k, n, g): Mixtral prefill, DeepSeek-V3 decode and prefill, ragged dims.
PROBLEMS = [
  (8192, 4096, 14336, 8),
  (512, 7168, 2048, 256),
  (131072, 2048, 7168, 256),
  (1000, 1000, 1000, 8),
  (24, 8, 16, 3),
]


def test_chips_by_each_spelling():
  assert [c.name for c in common.CHIPS] == ["v4", "v5e", "v5p", "v6e", "v7x"]
  assert common.chip("TPU v5 lite") is common.chip("TPU v5e") and common.chip("TPU v5") is common.chip("TPU v5p")
  assert common.chip("TPU v6 lite").scoped_vmem == 32 * MIB and tpu.vmem_limit("TPU v4") == 16 * MIB
  assert common.chip("cpu") is None and tpu.vmem_limit("cpu") == tpu.vmem_limit(None) == 16 * MIB
  assert tpu.default_source("TPU v5e") == "compile-verified" and tpu.default_source("cpu") == "heuristic"
  # v7x: jax's one spelling ("TPU7x"); 32 MiB scoped VMEM as on v6e, 96 GiB a device (a TensorCore).
  v7x = common.chip("TPU7x")
  assert v7x.name == "v7x" and common.canonical_kind("TPU7x") == "TPU7x" and v7x.hbm == 96 << 30
  assert v7x.scoped_vmem == 32 * MIB and tpu.default_source("TPU7x") == "compile-verified"
  assert common.chip("TPU v7x") is None and common.chip("TPU7") is None, "not spellings jax gives v7x"


def test_vmem_rule_counts_double_buffered_tiles_and_the_accumulator():
  # Mixtral fwd, 512x2048x2048 bf16: 2 x (2 + 8 + 2) MiB of tiles and a 4 MiB f32
  # accumulator: the 28.00M libtpu reports for v5e.
  assert TpuConfig(512, 2048, 2048).vmem_bytes("fwd", "bfloat16", 8192, 4096, 14336) == 28 * MIB
  # One k tile covers the contraction: no accumulator (17.25M for 64x4096x1024).
  assert TpuConfig(64, 4096, 1024).vmem_bytes("fwd", "bfloat16", 8192, 4096, 14336) == 17.25 * MIB
  # drhs (tgmm): [tk, tm] x [tm, tn] tiles, its [tk, tn] output accumulated over the rows
  # always (libtpu on v6e: 42.00M for 2048x4096x256, 25.00M on v5e for 1024x256x4096).
  assert TpuConfig(512, 1024, 1024).vmem_bytes("drhs", "bfloat16", 8192, 1024, 14336) == 12 * MIB
  assert TpuConfig(2048, 4096, 256).vmem_bytes("drhs", "bfloat16", 8192, 4096, 14336) == 42 * MIB
  assert TpuConfig(1024, 256, 4096).vmem_bytes("drhs", "bfloat16", 8192, 4096, 14336) == 25 * MIB
  assert TpuConfig(128, 128, 128).vmem_bytes("fwd", "float32", 8192, 4096, 14336) == 7 * 128 * 128 * 4


@pytest.mark.parametrize("kind", [c.device_kinds[0] for c in common.CHIPS] + ["cpu"])
def test_default_is_the_largest_tile_within_half_the_scoped_vmem(kind):
  budget = tpu.vmem_limit(kind) // 2
  for (m, k, n, g), op, dtype in itertools.product(PROBLEMS, ("fwd", "dlhs", "drhs"), ("bfloat16", "float32")):
    cfg = tpu.default(op, dtype, m, k, n, g, kind)
    assert cfg.vmem_bytes(op, dtype, m, k, n) <= budget, (kind, op, dtype, cfg)
    rows, contraction, cols = tpu.op_dims(op, m, k, n)
    assert cfg.tm <= 512 and cfg.tm >= min(16 if dtype == "bfloat16" else 8, tpu.next_pow2(rows))
    # No larger power-of-two tile of the dims fits the same half.
    cap = lambda d: max(128, tpu.next_pow2(d))
    for tk, tn in itertools.product(tpu.DEFAULT_TILES, tpu.DEFAULT_TILES):
      if tk * tn > cfg.tk * cfg.tn and tk <= cap(contraction) and tn <= cap(cols):
        assert TpuConfig(cfg.tm, tk, tn).vmem_bytes(op, dtype, m, k, n) > budget, (kind, op, cfg, tk, tn)


def test_defaults_by_family():
  # Prefill: 512-row tiles; decode (2 rows a group): 16 rows for bf16.
  assert tpu.default("fwd", "bfloat16", 8192, 4096, 14336, 8, "TPU v5 lite") == TpuConfig(512, 512, 1024)
  assert tpu.default("fwd", "bfloat16", 8192, 4096, 14336, 8, "TPU v6 lite") == TpuConfig(512, 2048, 1024)
  assert tpu.default("fwd", "bfloat16", 512, 7168, 2048, 256, "TPU v6 lite").tm == 16
  # v7x: v6e's scoped VMEM, so v6e's tiles.
  for m, k, n, g in PROBLEMS:
    for op in ("fwd", "dlhs", "drhs"):
      assert tpu.default(op, "bfloat16", m, k, n, g, "TPU7x") == tpu.default(op, "bfloat16", m, k, n, g, "TPU v6 lite")


def test_space_keeps_only_what_the_rule_fits_once_each():
  for kind in ("TPU v5 lite", "TPU v6 lite"):
    for (m, k, n, _g), op in itertools.product(PROBLEMS, ("fwd", "dlhs", "drhs")):
      space = tpu.space(op, "bfloat16", m, k, n, kind)
      assert space and len(set(space)) == len(space)
      assert all(c.fits(op, "bfloat16", m, k, n, kind) for c in space)
  v5e = tpu.space("fwd", "bfloat16", 8192, 4096, 14336, "TPU v5 lite")
  v6e = tpu.space("fwd", "bfloat16", 8192, 4096, 14336, "TPU v6 lite")
  assert set(v5e) < set(v6e), "twice the scoped VMEM keeps more tilings"
