"""benchmarks/bench_ragged_dot.py on a CPU host times the Pallas kernel, interpreted and labelled."""

import importlib.util
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU host's behaviour")
def test_bench_times_pallas_interpret_beside_xla(capsys):
  spec = importlib.util.spec_from_file_location("bench_ragged_dot", ROOT / "benchmarks" / "bench_ragged_dot.py")
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  bench.main(["--m", "48", "--k", "32", "--n", "32", "--g", "2", "--dtype", "float32", "--warmup", "1", "--iters", "2"])
  out = capsys.readouterr().out
  rows = {line.split("  ")[0].strip() for line in out.splitlines()[-3:]}
  assert rows == {
    "pallas_gpu [INTERPRET mode, CPU emulation: not GPU/TPU speed]",
    "xla ragged_dot",
    "dense matmul, same FLOPs",
  }, out
  assert "NOTE: no pallas_gpu hardware here" in out and "check vs lax: PASS" in out
  assert "config: fwd: pallas_gpu TritonConfig(" in out and "<- heuristic" in out
