"""LUT format: round trip, nearest-shape lookup, LutFn for megablox, device checks, corrupt files."""

import importlib
import json
import logging
import tomllib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import entry_config, rand, selected_config

import kernels

KIND = jax.devices()[0].device_kind


def _lut(kind=KIND):
  G = kernels.TritonConfig
  T = kernels.TpuConfig
  entries = [
    kernels.Entry("fwd", "pallas_gpu", "bfloat16", 4096, 4096, 14336, 8, G(128, 64, 128, 8, 3), {"time_s": 1e-3}),
    kernels.Entry("fwd", "pallas_gpu", "bfloat16", 64, 4096, 14336, 8, G(16, 128, 64, 4, 3), {"time_s": 1e-4}),
    kernels.Entry("dlhs", "pallas_gpu", "bfloat16", 4096, 4096, 14336, 8, G(64, 64, 128, 4, 3)),
    kernels.Entry("fwd", "pallas_tpu", "bfloat16", 512, 1024, 2048, 8, T(256, 512, 1024)),
    kernels.Entry("dlhs", "pallas_tpu", "bfloat16", 512, 1024, 2048, 8, T(128, 1024, 512)),
  ]
  return kernels.Lut(kind, entries, meta={"jax_version": jax.__version__})


def test_round_trip_file_and_folder(tmp_path):
  lut = _lut()
  path = tmp_path / f"{kernels.device_slug(KIND)}.json"
  path.write_text(json.dumps(lut.to_dict()))
  for target in (path, tmp_path):
    loaded = kernels.load_lut(target)
    assert loaded.entries() == lut.entries()
    assert loaded.shapes() == [(64, 4096, 14336), (512, 1024, 2048), (4096, 4096, 14336)]
    assert kernels.lut.active_lut() is loaded


def test_exact_and_nearest_lookup():
  lut = _lut()
  assert entry_config(lut.query("fwd", 4096, 4096, 14336, 8, "bfloat16", backend="pallas_gpu")) == kernels.TritonConfig(
    128, 64, 128, 8, 3
  )
  # Nearest in m for the same (k, n): 100 rows is closer to 64 than to 4096.
  assert entry_config(lut.query("fwd", 100, 4096, 14336, 8, jnp.bfloat16, backend="pallas_gpu")).block_m == 16
  assert entry_config(lut.query("fwd", 3000, 4096, 14336, 8, "bfloat16", backend="pallas_gpu")).block_m == 128
  # Other dtype, op or a far-away shape: nothing.
  assert entry_config(lut.query("fwd", 4096, 4096, 14336, 8, "float32", backend="pallas_gpu")) is None
  assert entry_config(lut.query("drhs", 4096, 4096, 14336, 8, "bfloat16")) is None
  assert entry_config(lut.query("fwd", 4096, 64, 64, 8, "bfloat16", backend="pallas_gpu")) is None


def test_nearest_only_returns_configs_that_fit():
  big = kernels.TritonConfig(256, 256, 256, 8, 8)  # ~2 MiB of shared memory at bf16: never fits
  lut = kernels.Lut(KIND, [kernels.Entry("fwd", "pallas_gpu", "bfloat16", 4096, 4096, 4096, 8, big)])
  assert entry_config(lut.query("fwd", 4096, 4096, 4096, 8, "bfloat16")) is None


def test_fit_uses_the_luts_own_device():
  # 128x64x256, 4 stages at bf16: 192 KiB of shared memory. An H100 block takes 227 KiB, an
  # A100 163 KiB, and an unknown GPU gets the 99 KiB that every sm_80+ part allows.
  cfg = kernels.TritonConfig(128, 64, 256, 8, 4)
  assert cfg.smem_bytes("fwd", "bfloat16", 4096, 4096, 4096) == 192 * 1024
  for kind, fits in (
    ("NVIDIA H100 80GB HBM3", True),
    ("NVIDIA H200", True),
    ("NVIDIA A100-SXM4-80GB", False),
    ("NVIDIA L4", False),
  ):
    lut = kernels.Lut(kind, [kernels.Entry("fwd", "pallas_gpu", "bfloat16", 4096, 4096, 4096, 8, cfg)])
    assert (entry_config(lut.query("fwd", 4096, 4096, 4096, 8, "bfloat16")) == cfg) is fits, kind


def test_older_schema_is_refused(tmp_path):
  """A LUT from before the launch-order knobs (schema 1, grid_order) gets the clear error."""
  path = tmp_path / "old.json"
  path.write_text(
    json.dumps(
      {
        "schema": "ragtune-lut",
        "schema_version": 1,
        "device_kind": KIND,
        "entries": [
          {
            "op": "fwd",
            "backend": "pallas_gpu",
            "dtype": "bfloat16",
            "m": 8,
            "k": 8,
            "n": 8,
            "g": 1,
            "config": {
              "block_m": 16,
              "block_k": 16,
              "block_n": 16,
              "num_warps": 4,
              "num_stages": 2,
              "grid_order": "m_fastest",
            },
          }
        ],
      }
    )
  )
  with pytest.raises(kernels.LutError, match="schema_version 1 is not supported"):
    kernels.load_lut(path)


def test_lut_fn_uses_megablox_frames():
  lut = _lut()
  assert lut.lut_fn("fwd")(512, 1024, 2048) == (256, 512, 1024)
  # megablox calls the dlhs LutFn with (m, n, k) of the forward problem.
  assert lut.lut_fn("dlhs")(512, 2048, 1024) == (128, 1024, 512)
  assert lut.lut_fn("fwd")(512, 7, 9) is None
  assert all(type(v) is int for v in lut.lut_fn("fwd")(512, 1024, 2048))


def test_lut_fn_reads_pallas_tpu_entries_falls_back_and_cuts_tm_to_divide_m():
  """megablox needs m % tm == 0 (kernels pads m instead): the largest multiple of 8 up to tm
  that divides m, else m; the fallback likewise. A GPU's entries are not megablox tilings."""
  lut = _lut()
  assert lut.lut_fn("fwd")(480, 1024, 2048) == (240, 512, 1024)  # the entry's tm 256, cut
  gpu_only = kernels.Lut(KIND, [e for e in lut.entries() if e.backend != "pallas_tpu"])
  assert gpu_only.lut_fn("fwd")(4096, 4096, 14336) is None
  fallback = gpu_only.lut_fn("fwd", fallback=(128, 128, 128))
  assert [fallback(m, 64, 80) for m in (96, 100, 1000, 4)] == [
    (96, 128, 128),
    (100, 128, 128),  # no multiple of 8 divides 100: one row tile
    (40, 128, 128),
    (4, 128, 128),
  ]


def test_lut_fn_drives_megablox_gmm():
  mb = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")
  lut = kernels.Lut(
    KIND, [kernels.Entry("fwd", "pallas_tpu", "float32", 64, 128, 128, 2, kernels.TpuConfig(16, 128, 128))]
  )
  lhs, rhs, gs = rand(1, (64, 128), jnp.float32), rand(2, (2, 128, 128), jnp.float32), jnp.array([30, 34], jnp.int32)
  out = mb.gmm(lhs, rhs, gs, jnp.float32, tiling=lut.lut_fn("fwd"), interpret=True)
  np.testing.assert_allclose(out, jax.lax.ragged_dot(lhs, rhs, gs, precision="highest"), atol=1e-4)


def test_ragged_dot_uses_active_lut():
  cfg = kernels.TritonConfig(16, 32, 16, 2, 2)
  lut = kernels.Lut(KIND, [kernels.Entry("fwd", "pallas_gpu", "float32", 40, 32, 48, 3, cfg)])
  assert selected_config("fwd", "pallas_gpu", 40, 32, 48, 3, jnp.float32) != cfg
  kernels.lut.set_active_lut(lut)
  assert selected_config("fwd", "pallas_gpu", 40, 32, 48, 3, jnp.float32) == cfg
  jaxpr = str(
    jax.make_jaxpr(lambda a, b, g: kernels.ragged_dot(a, b, g, backend="pallas_gpu"))(
      jnp.ones((40, 32)), jnp.ones((3, 32, 48)), jnp.array([10, 10, 20], jnp.int32)
    )
  )
  assert "num_warps=2" in jaxpr and "num_stages=2" in jaxpr


def test_env_var_and_device_mismatch(tmp_path, monkeypatch):
  other = _lut("NVIDIA H100 80GB HBM3")
  path = tmp_path / "h100.json"
  path.write_text(json.dumps(other.to_dict()))
  monkeypatch.setenv(kernels.lut.ENV_VAR, str(path))
  with pytest.raises(kernels.LutError, match="tuned on 'NVIDIA H100 80GB HBM3'"):
    kernels.load_lut()
  assert kernels.load_lut(force=True).device_kind == "NVIDIA H100 80GB HBM3"


def test_no_lut_anywhere_gives_empty_lut(monkeypatch):
  monkeypatch.delenv(kernels.lut.ENV_VAR, raising=False)
  lut = kernels.load_lut()  # no LUT is bundled for the CPU
  assert len(lut) == 0 and lut.source is None and lut.device_kind == KIND


@pytest.mark.parametrize(
  "content,match",
  [
    ("{not json", "invalid JSON"),
    ('{"schema": "ragtune-lut", "schema_version": 99, "device_kind": "cpu", "entries": []}', "schema_version 99"),
    ('{"schema": "other", "schema_version": 1}', "not a ragtune LUT"),
    ('[1, 2]', "not a ragtune LUT"),
    ('{"schema": "ragtune-lut", "schema_version": 2, "device_kind": "cpu", "entries": [{"op": "fwd"}]}', "missing key"),
    (
      '{"schema": "ragtune-lut", "schema_version": 2, "device_kind": "cpu", "entries": [{"op": "fwd", "backend": '
      '"pallas_gpu", "dtype": "bfloat16", "m": 1, "k": 1, "n": 1, "g": 1, "config": {"block_m": 33}}]}',
      "block_m",
    ),
  ],
)
def test_corrupt_or_unknown_lut(tmp_path, content, match):
  path = tmp_path / "bad.json"
  path.write_text(content)
  with pytest.raises(kernels.LutError, match=match):
    kernels.load_lut(path)


def _bad_luts(tmp_path):
  """(RAGTUNE_LUT value, the rest of the message after it) for each way the variable can be wrong."""
  corrupt = tmp_path / "corrupt.json"
  corrupt.write_text("{not json")
  other = tmp_path / "h100.json"
  other.write_text(json.dumps(_lut("NVIDIA H100 80GB HBM3").to_dict()))
  (tmp_path / "empty").mkdir()
  latin1 = tmp_path / "latin1.json"
  latin1.write_bytes(b'{"schema": "ragtune-lut",\n "note": "caf\xe9"}')
  slug = f"{kernels.device_slug(KIND)}.json"
  return [
    (tmp_path / "missing.json", ": no such LUT file or folder"),
    (corrupt, ":1: corrupt LUT, invalid JSON (Expecting property name enclosed in double quotes)"),
    (latin1, ":2: corrupt LUT, not UTF-8 text (byte 0xe9 at column 14)"),
    (
      other,
      f": LUT was tuned on 'NVIDIA H100 80GB HBM3' but this device is {KIND!r}; pass force=True to use it anyway",
    ),
    (tmp_path / "empty", f": no LUT for device {KIND!r} (looked for {slug}; found no .json files)"),
  ]


def test_env_var_is_named_in_its_errors(tmp_path, monkeypatch):
  for path, rest in _bad_luts(tmp_path):
    monkeypatch.setenv(kernels.lut.ENV_VAR, str(path))
    kernels.lut.reset_active_lut()
    for _ in range(2):  # the default: every call raises, nothing is half-loaded
      with pytest.raises(kernels.LutError) as e:
        kernels.explain((64, 32), (2, 32, 48), jnp.float32, backend="pallas_gpu")
      assert str(e.value) == f"RAGTUNE_LUT={path}{rest}"
    # The same file given in code is named as itself.
    with pytest.raises(kernels.LutError) as e:
      kernels.load_lut(path)
    assert not str(e.value).startswith("RAGTUNE_LUT")


def test_on_error_warn_falls_back_to_the_heuristics_once(tmp_path, monkeypatch, caplog):
  monkeypatch.setenv(kernels.lut.ON_ERROR_VAR, "warn")
  for path, rest in _bad_luts(tmp_path):
    monkeypatch.setenv(kernels.lut.ENV_VAR, str(path))
    kernels.lut.reset_active_lut()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kernels"):
      for m in (64, 80):
        fwd = kernels.explain((m, 32), (2, 32, 48), jnp.float32, backend="pallas_gpu")["fwd"]
        assert fwd.source == "heuristic"
    assert [r.getMessage() for r in caplog.records if r.name == "kernels"] == [
      f"RAGTUNE_LUT_ON_ERROR=warn: RAGTUNE_LUT={path}{rest}; using no LUT, the built-in heuristics run"
    ]
    assert len(kernels.lut.active_lut()) == 0
  # An explicit path is the caller's own: it still raises.
  with pytest.raises(kernels.LutError, match="no such LUT file"):
    kernels.load_lut(tmp_path / "missing.json")
  monkeypatch.setenv(kernels.lut.ON_ERROR_VAR, "wran")
  with pytest.raises(kernels.LutError) as e:
    kernels.load_lut()
  assert str(e.value).startswith(
    "RAGTUNE_LUT_ON_ERROR=wran: expected 'raise' or 'warn' (on this LUT error: RAGTUNE_LUT="
  )


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="auto runs XLA's op, reading no LUT, on a CPU")
def test_a_broken_ragtune_lut_raises_where_auto_asks_no_lut(tmp_path, monkeypatch, caplog):
  """On a CPU, auto runs XLA's op and asks no LUT; a RAGTUNE_LUT that cannot be read raises
  all the same (or warns), so it shows before it ships. A LUT for another device, or a folder
  without this device's, is no error there: nothing would use it."""
  shape = ((64, 32), (2, 32, 48), jnp.float32)
  bad = _bad_luts(tmp_path)
  for path, rest in bad[:3]:  # missing, corrupt, not UTF-8
    monkeypatch.setenv(kernels.lut.ENV_VAR, str(path))
    kernels.lut.reset_active_lut()
    for call in (lambda: kernels.explain(*shape), lambda: kernels.explain(*shape, backend="xla")):
      with pytest.raises(kernels.LutError) as e:
        call()
      assert str(e.value) == f"RAGTUNE_LUT={path}{rest}"
    with pytest.raises(kernels.LutError):
      kernels.ragged_dot(jnp.ones((8, 4)), jnp.ones((2, 4, 4)), jnp.array([4, 4], jnp.int32))
  for path, _ in bad[3:]:  # another device's LUT, a folder without this device's
    monkeypatch.setenv(kernels.lut.ENV_VAR, str(path))
    kernels.lut.reset_active_lut()
    assert kernels.explain(*shape)["fwd"].backend == "xla"
  monkeypatch.setenv(kernels.lut.ON_ERROR_VAR, "warn")
  monkeypatch.setattr(kernels.lut, "_warned", set(), raising=False)
  monkeypatch.setenv(kernels.lut.ENV_VAR, str(bad[1][0]))
  kernels.lut.reset_active_lut()
  reads = []
  real_from_file = kernels.Lut.from_file.__func__
  monkeypatch.setattr(kernels.Lut, "from_file", classmethod(lambda cls, p: reads.append(p) or real_from_file(cls, p)))
  with caplog.at_level(logging.WARNING, logger="kernels"):
    assert all(kernels.explain(*shape)["fwd"].backend == "xla" for _ in range(2))
  assert [r.getMessage() for r in caplog.records if r.name == "kernels"] == [
    f"RAGTUNE_LUT_ON_ERROR=warn: RAGTUNE_LUT={bad[1][0]}{bad[1][1]}; using no LUT, the built-in heuristics run"
  ]
  assert len(reads) == 1, "a broken file warned of is not read again on every call"


def test_on_error_warn_once_per_process_per_error(tmp_path, monkeypatch, caplog):
  """Each load of the default LUT (load_lut(), a reset, a new thread's first call) meets the
  same broken file; the log says so once, and once more for another broken file."""
  monkeypatch.setenv(kernels.lut.ON_ERROR_VAR, "warn")
  monkeypatch.setattr(kernels.lut, "_warned", set(), raising=False)
  (a, _), (b, _) = _bad_luts(tmp_path)[:2]
  with caplog.at_level(logging.WARNING, logger="kernels"):
    for path in (a, a, b, a, b):
      monkeypatch.setenv(kernels.lut.ENV_VAR, str(path))
      kernels.lut.reset_active_lut()
      kernels.load_lut()
      assert kernels.explain((64, 32), (2, 32, 48), jnp.float32, backend="pallas_gpu")["fwd"].source == "heuristic"
  warned = [r.getMessage() for r in caplog.records if r.name == "kernels"]
  assert len(warned) == 2 and f"RAGTUNE_LUT={a}" in warned[0] and f"RAGTUNE_LUT={b}" in warned[1]


def test_bundled_luts_folder_and_search_order(tmp_path, monkeypatch):
  """kernels/luts/ ships (README only: no LUT is bundled for a device we have no timings of),
  the wheel takes its .json files, and the default search reads RAGTUNE_LUT, then it."""
  assert (kernels.lut.BUNDLED_DIR / "README.md").is_file()
  pyproject = tomllib.loads((kernels.lut.BUNDLED_DIR.parents[1] / "pyproject.toml").read_text())
  assert "luts/*.json" in pyproject["tool"]["setuptools"]["package-data"]["kernels"]
  bundled = tmp_path / "luts"
  bundled.mkdir()
  (bundled / f"{kernels.device_slug(KIND)}.json").write_text(json.dumps(_lut().to_dict()))
  monkeypatch.setattr(kernels.lut, "BUNDLED_DIR", bundled)
  monkeypatch.delenv(kernels.lut.ENV_VAR, raising=False)
  assert kernels.load_lut().source == str(bundled / f"{kernels.device_slug(KIND)}.json")
  env = tmp_path / "env.json"
  env.write_text(json.dumps(kernels.Lut(KIND).to_dict()))
  monkeypatch.setenv(kernels.lut.ENV_VAR, str(env))
  assert kernels.load_lut().source == str(env)
  # A RAGTUNE_LUT that holds no LUT for this device does not fall through to the bundled one.
  monkeypatch.setenv(kernels.lut.ENV_VAR, str(tmp_path / "missing.json"))
  with pytest.raises(kernels.LutError, match="missing.json: no such LUT file or folder"):
    kernels.load_lut()
