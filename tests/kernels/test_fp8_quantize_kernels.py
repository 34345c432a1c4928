"""pallas_gpu's single-pass fp8 quantizers (kernels/pallas_gpu/quantize.py) in the interpreter,
bit for bit against kernels.quant's XLA versions: quantize_rows against quant.quantize(x, dtype,
(1, 128)), quantize_token_blocks against quant.quantize_tokens; and both compiled deviceless for
an H100 at DeepSeek-V3's size, with no spill and the division XLA's own quantizer compiles to."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import gpu_compile_missing, needs_compiler

from kernels import quant
from kernels.pallas_gpu import quantize as qk

E4M3 = "float8_e4m3fn"
B = quant.BLOCK


def _x(seed, m, c, dtype=jnp.bfloat16):
  """Normal rows times random powers of two (2^-12..2^12, so a block read past its row's end,
  or a neighbour's row, sees a different amax), one all-zero 128-block and one all-zero row.
  Such blocks put 1-2% of the quotients x / scale within an ulp of an e4m3 rounding
  boundary (a kernel whose quotient is 1 ulp off fails on ~1000 values a case), so equality checks
  the scale and the division to the last bit."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((m, c)) * 2.0 ** rng.integers(-12, 13, (m, 1))
  x[3, B:] = 0.0  # the last, partial block of row 3: scale 1
  x[7] = 0.0
  return jnp.asarray(x, dtype)


def _assert_same(got, want):
  (q, s), (wq, ws) = got, want
  assert q.dtype == wq.dtype and q.shape == wq.shape and s.dtype == jnp.float32 and s.shape == ws.shape
  np.testing.assert_array_equal(np.asarray(q.astype(jnp.float32)), np.asarray(wq.astype(jnp.float32)))
  np.testing.assert_array_equal(np.asarray(s), np.asarray(ws))


@pytest.mark.parametrize(
  ("m", "c", "block_rows", "dtype"),
  [(300, 200, 32, jnp.bfloat16), (45, 136, 16, jnp.float32)],
  ids=["bf16", "f32"],
)
def test_quantize_rows_matches_quant(m, c, block_rows, dtype):
  """c off 128 (the last block's amax over its real columns only), m off the row block, an
  all-zero block and row (scale 1), bf16 and f32 inputs."""
  x = _x(0, m, c, dtype)
  got = qk.quantize_rows(x, E4M3, block_rows=block_rows, interpret=True)
  want = quant.quantize(x, E4M3, (1, B))
  _assert_same(got, want)
  assert (np.asarray(got[1])[[3, 7], 1] == 1).all()


# (group sizes, m, c, (group_offset, g_local) shards): empty groups first, in the middle and
# last, a group over a block boundary (130), one of exactly 128, sum(sizes) < m; c off 128 and
# off block_cols.
TOKEN_CASES = [
  ((0, 130, 57, 0, 90), 300, 200, ((0, 5), (1, 3))),
  ((128, 0, 1, 40, 0), 190, 136, ((0, 5), (2, 2))),
]


@pytest.mark.parametrize(("sizes", "m", "c", "shards"), TOKEN_CASES, ids=["c200", "c136"])
def test_quantize_token_blocks_matches_quant(sizes, m, c, shards):
  x = _x(1, m, c)
  gs = jnp.asarray(sizes, jnp.int32)
  for offset, g in shards:
    blocks = quant.token_blocks(gs, m, jnp.int32(offset), g)
    got = qk.quantize_token_blocks(x, blocks, E4M3, block_cols=64, interpret=True)
    _assert_same(got, quant.quantize_tokens(x, blocks, E4M3))
  # the padding blocks after the groups (all of them zeros) got scale 1
  last = int(blocks.first[-1] + blocks.count[-1])
  assert last < got[1].shape[0] and (np.asarray(got[1])[last:] == 1).all()


def test_bad_calls_say_what_to_do():
  x = jnp.ones((8, 128), jnp.bfloat16)
  blocks = quant.token_blocks(jnp.asarray([8], jnp.int32), 8, None, 1)
  with pytest.raises(ValueError, match="float8_e4m3fn"):
    qk.quantize_rows(x, "int8", interpret=True)
  with pytest.raises(ValueError, match="float8_e4m3fn"):
    qk.quantize_token_blocks(x, blocks, jnp.int8, interpret=True)
  with pytest.raises(ValueError, match="power of two"):
    qk.quantize_rows(x, block_rows=24, interpret=True)
  with pytest.raises(ValueError, match="power of two"):
    qk.quantize_token_blocks(x, blocks, block_cols=48, interpret=True)


# --- compiled for an H100, without one --------------------------------------------------------

M, C, G = 8192, 7168, 8  # DeepSeek-V3's hidden size, 8 local experts


def _rows(x):
  return qk.quantize_rows(x)


def _tokens(x, gs):
  return qk.quantize_token_blocks(x, quant.token_blocks(gs, M, None, G))


@needs_compiler(gpu_compile_missing(), "deviceless compile tests")
@pytest.mark.parametrize(
  ("fn", "shapes", "name"),
  [
    (_rows, [((M, C), jnp.bfloat16)], "ragtune_quantize_rows"),
    (_tokens, [((M, C), jnp.bfloat16), ((G,), jnp.int32)], "ragtune_quantize_token_blocks"),
  ],
  ids=["rows", "token_blocks"],
)
def test_kernels_compile_for_h100(fn, shapes, name):
  """One kernel each, no spill; quantize_rows is the whole program (XLA's is three kernels)."""
  from ragtune.deviceless import aot

  report = aot.compile_fn("h100", fn, *shapes)
  assert report.ok, f"{report.outcome}: {report.error}"
  assert [r.name for r in report.kernels] == [name]
  (r,) = report.kernels
  assert r.spill_bytes == 0 and r.loop_spills == 0 and r.stack_bytes == 0, r
  if fn is _rows:
    assert not report.xla_kernels, report.thunks


# f32 division (div.rn, div.full, div.approx; a reciprocal) and conversion to e4m3 in PTX, and
# in SASS: MUFU.RCP (a reciprocal), FCHK (IEEE division's range check before its slow path),
# F2FP...E4M3 (the conversion).
_PTX = re.compile(r"\b(div\.\w+\.f32|rcp\.\w+\.f32|cvt\.[\w.]*e4m3\w*\.f32)\b")
_SASS = re.compile(r"\b(MUFU\.RCP|FCHK|F2FP\.[\w.]*E4M3[\w.]*)\b")


@needs_compiler(gpu_compile_missing(), "deviceless compile tests")
def test_divides_and_converts_as_xla_on_h100(tmp_path):
  """The kernels' f32 division and e4m3 conversion are the instructions XLA's own
  quant.quantize compiles to for an H100: with the same scale the values are then
  bit-identical on the GPU too, as the interpreter shows they are on the CPU. In PTX where
  XLA dumps it (jaxlib 0.10: div.full.f32 and cvt.rn.satfinite.e4m3x2.f32), and in the
  machine code on every jax (a reciprocal, no IEEE division's FCHK, the same conversion)."""

  from jax.experimental import serialize_executable
  from jax.sharding import NamedSharding, PartitionSpec

  from ragtune import provenance
  from ragtune.deviceless import aot, machine_code

  mesh, _ = aot.target_mesh("h100")
  options = {"xla_gpu_cuda_data_dir": cuda} if (cuda := provenance.cuda_data_dir()) else {}
  tool = machine_code.find_tool("cuobjdump")
  ptx, sass = {}, {}
  for what, fn in (("xla", lambda x: quant.quantize(x, E4M3, (1, B))), ("pallas", lambda x: qk.quantize_rows(x))):
    x = jax.ShapeDtypeStruct((256, 512), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec()))
    dump = tmp_path / what
    with jax.set_mesh(mesh):
      compiled = jax.jit(fn).lower(x).compile(compiler_options={"xla_dump_to": str(dump), **options})
    ptx[what] = {d for p in dump.glob("*.ptx") for d in _PTX.findall(p.read_text())}
    sass[what] = set()
    for i, cubin in enumerate(machine_code.cubins(serialize_executable.serialize(compiled)[0])):
      path = tmp_path / f"{what}{i}.cubin"
      path.write_bytes(cubin)
      sass[what] |= set(_SASS.findall(machine_code._run(tool, "-sass", str(path))))
  assert "MUFU.RCP" in sass["xla"] and "FCHK" not in sass["xla"] and sass["pallas"] == sass["xla"], sass
  assert any(op.startswith("F2FP") for op in sass["xla"]), sass
  if ptx["xla"]:  # jaxlib 0.12 dumps no PTX here
    assert any(d.startswith("div") for d in ptx["xla"]) and ptx["pallas"] == ptx["xla"], ptx
