"""benchmarks/gpu_run.py report: each step's line in the closing summary says what it left."""

from conftest import load_benchmark


def test_summary_names_what_the_tuning_steps_left(tmp_path, capsys):
  out, res = tmp_path / "out", tmp_path / "results" / "dev"
  (res / "exhaustive").mkdir(parents=True)
  out.mkdir()
  (res / "records.jsonl").write_text("{}\n" * 7)
  (res / "exhaustive" / "records.jsonl").write_text("{}\n" * 3)
  steps = [("anchors-sweep", 330, 330, 331, 124, "stopped at cap, resumable"), ("ship", 300, 300, 40, 0, "ok")]
  (out / "steps.tsv").write_text("".join("\t".join(map(str, s)) + "\n" for s in steps))
  verified = "verified 4 entries in 30s: 4 passed, 0 failed"
  (out / "ship.log").write_text(f"dev: 4 entries\n{verified}\nbundled kernels/luts/dev.json\n")
  gpu_run = load_benchmark("gpu_run")
  assert gpu_run.main(["report", "--out", str(out), "--res", str(res)]) == 0
  lines = {l.split()[0]: l for l in (out / "summary.txt").read_text().splitlines() if l.strip()}
  assert lines["anchors-sweep"].endswith(f"7 rows in {res / 'records.jsonl'}")
  assert lines["ship"].endswith("verified 4 entries in 30s: 4 passed, 0 failed; bundled kernels/luts/dev.json")
  capsys.readouterr()

  (out / "ship.log").write_text("dev: 4 entries\nverified 4 entries in 30s: 3 passed, 1 failed\n")
  (out / "steps.tsv").write_text("exhaustive\t330\t330\t20\t0\tok\nship\t300\t300\t40\t1\tFAILED (exit 1)\n")
  assert gpu_run.main(["report", "--out", str(out), "--res", str(res)]) == 0
  lines = {l.split()[0]: l for l in (out / "summary.txt").read_text().splitlines() if l.strip()}
  assert lines["exhaustive"].endswith(f"3 rows in {res / 'exhaustive' / 'records.jsonl'}")
  assert lines["ship"].endswith("3 passed, 1 failed; nothing bundled")


def test_bench_table_takes_the_faster_of_two_rows_of_one_peer():
  """tokamax's auto row and its Triton row share the tokamax column: the faster one is the peer."""
  gpu_run = load_benchmark("gpu_run")
  row = lambda variant, ms, status="ok": dict(
    shape="[8,4]x[2,4,8]", op="fwd", variant=variant, ms=ms, tflops="100", status=status, same_as=""
  )
  rows = [row("mosaic_gpu default", "1.0"), row("tokamax ragged_dot", "3.0"), row("tokamax triton", "2.0")]
  rows += [row("tokamax triton", "", "wrong: FAIL"), row("dense matmul, same FLOPs", "0.9")]
  head, line = gpu_run.bench_table(rows)[:2]
  assert head.split()[:5] == ["problem", "op", "mosaic_gpu", "tokamax", "dense"], head
  assert line.split()[-1] == "2.00x" and "2 ms" in line, line
