"""benchmarks/band_probe.py: which variants it times (its GPU run is the measurement)."""

from conftest import load_benchmark

from kernels.mosaic_gpu import config

H100 = "NVIDIA H100 80GB HBM3"


def test_every_band_with_and_without_narrow_cells_where_they_apply():
  probe = load_benchmark("band_probe")
  p = probe.problem("fwd", *probe.PROBLEMS["DeepSeek-V3 up"])
  assert sum(p.group_sizes) == p.m and len(p.group_sizes) == p.g
  cfgs = probe.configs(p, H100)
  assert sorted({c.group_m for c in cfgs.values()}) == list(probe.BANDS) and len(cfgs) == 2 * len(probe.BANDS)
  base = config.default("fwd", "bfloat16", p.m, p.k, p.n, p.g, H100)
  assert cfgs["mosaic_gpu band 16 narrow"] == base  # the default is among them, as it ships
  # Bands past a group's row tiles launch the same cells: the probe times one of them.
  widest = {config.launch_key(c, "fwd", p.m, p.k, p.n, p.group_sizes) for c in cfgs.values()}
  assert len(widest) < len(cfgs)
  # DeepSeek-V3 decode's 64-row cells have no narrow variant (narrow_tail_applies).
  d = probe.problem("fwd", 512, 7168, 2048, 256)
  assert not any(c.narrow_tail for c in probe.configs(d, H100).values())
