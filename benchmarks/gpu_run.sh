#!/usr/bin/env bash
# GPU work in stages, for a GPU machine with no package index (benchmarks/README.md). The
# stages are time-boxed, so name several in one batch job where they fit:
#
# Once, where a package index is reachable:  bash benchmarks/gpu_wheels.sh      (writes .whl/)
# Each job on the GPU machine, with .whl/:   bash benchmarks/gpu_run.sh STAGE [STAGE ...]
#
#   check       versions, the kernel tests compiled on the GPU, the ceilings, the timer   (~6 min)
#   sweep       shapes/anchors.yaml (fwd first, then all ops), then shapes/gpu_slice.yaml,
#               budgeted; stops itself after SWEEP_S seconds (default 330) and resumes in
#               the next job
#   ship        export-lut, verify the LUT, bundle it in kernels/luts/ only if it passes,
#               report (verify gets VERIFY_S seconds, default 300)
#   tuned       benchmarks/anchors.py with the bundled LUT (once shipped): its choice, each
#               backend's default, XLA and dense, on the anchor problems (BENCH_S seconds,
#               default 520)
#   anchors     the same with the LUT a model finds (none before ship)
#   exhaustive  every pruned config of Mixtral fwd into results/<slug>/exhaustive/ (SWEEP_S),
#               resumable across jobs; ship merges it
#
# Three 10-minute jobs: `check`; then `SWEEP_S=270 VERIFY_S=200 ... sweep ship`; then `tuned`.
#
# Results: results/<device-slug>/ here is the sweep's folder. Each job packs it (and
# kernels/luts/ once a LUT is bundled) into $OUT/results.tgz; unpack that into the checkout
# before the next job (tar xzf results.tgz), so a fresh machine resumes where the last one
# stopped. The exit status is the worst of the steps. OUT (the folder a job's outputs are
# collected from) defaults to /tmp/ragtune-out.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: gpu_run.sh STAGE [STAGE ...]: check, sweep, ship, tuned, anchors, exhaustive" >&2; exit 2; }
SWEEP_S=${SWEEP_S:-330}
VERIFY_S=${VERIFY_S:-300}
BENCH_S=${BENCH_S:-520}
OUT=${OUT:-/tmp/ragtune-out}
SITE=${RAGTUNE_SITE:-/tmp/site}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "== $(date -u +%H:%M:%S) $*"; }
worst=0
# After a step (a pipeline, under pipefail): note its failure, and go on with the stage. A
# resumable sweep that `timeout` stopped (124) kept its rows: that is the plan, not a failure.
ok() {
  local rc=$?
  if [ "$rc" -eq 124 ] && [ "${2:-}" = resumable ]; then log "$1: stopped at its time limit; rows kept, a rerun resumes"
  elif [ "$rc" -ne 0 ]; then log "FAILED (rc $rc): $1"; worst=$rc; fi
}

[ -d "$SITE/pydantic" ] || bash benchmarks/gpu_wheels.sh --install "$SITE" || exit 2
export PYTHONPATH=$PWD:$SITE
SLUG=$(python3 -c "import kernels; print(kernels.device_slug(kernels.lut.current_device_kind()))") || exit 2
RES=results/$SLUG
mkdir -p "$RES"
pack() {
  local what=("$RES")
  [ -d kernels/luts ] && what+=(kernels/luts)
  if tar czf "$OUT/results.tgz" "${what[@]}"; then log "packed ${what[*]} into \$OUT/results.tgz"
  else log "FAILED to pack ${what[*]} into \$OUT/results.tgz"; fi
}
finish() { pack; exit "$worst"; }
trap finish EXIT

for STAGE in "$@"; do
case "$STAGE" in
check)
  log versions
  { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    python3 - <<'PY'
import importlib.metadata as md
import jax
def version(p):
  try:
    return md.version(p)
  except md.PackageNotFoundError:
    return "not installed"
print(", ".join(f"{p} {version(p)}" for p in ("jax", "jaxlib", "jax-cuda13-plugin", "triton", "tune-jax", "pydantic")))
print(jax.devices())
PY
    date -u +%FT%TZ; } 2>&1 | tee "$RES/device.txt"
  log "kernel tests, compiled on the GPU (full output: $RES/tests.txt)"
  timeout 330 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
    tests/kernels/test_gpu_compiled.py tests/ragtune/test_timing.py tests/kernels/test_conformance.py \
    -k "not pallas_tpu" > "$RES/tests.txt" 2>&1
  ok "kernel tests"; tail -40 "$RES/tests.txt"
  log "ceilings"
  python3 - <<'PY' 2>&1 | tee -a "$RES/device.txt"
import jax
from pathlib import Path
import kernels
from ragtune.device import ceilings
dev = jax.devices()[0]
c = ceilings.measure_ceilings(["bfloat16", "float16"], dev.platform)
ceilings.save(Path("results") / kernels.device_slug(dev.device_kind), {"device_kind": dev.device_kind, "jax_version": jax.__version__}, c)
print("ceilings:", c)
PY
  ok ceilings
  ;;
anchors)
  log "anchor benchmark, default configs"
  timeout "$BENCH_S" python3 benchmarks/anchors.py --csv "$RES/anchors_default.csv" 2>&1 | tee "$RES/anchors_default.txt"
  ok "anchor benchmark"
  ;;
sweep)
  log "sweep the anchors (fwd first), then the GPU slice, for ${SWEEP_S}s in all (SIGTERM keeps the rows; the next call resumes)"
  end=$(( $(date +%s) + SWEEP_S ))
  left() { local l=$(( end - $(date +%s) )); [ "$l" -gt 5 ] && echo "$l" || echo 5; }
  timeout -s TERM "$(left)" python3 -m ragtune sweep shapes/anchors.yaml -o "$RES" --op fwd --budget 8 --timeout 90 2>&1 | tail -25
  ok "sweep anchors.yaml fwd" resumable
  timeout -s TERM "$(left)" python3 -m ragtune sweep shapes/anchors.yaml -o "$RES" --budget 8 --timeout 90 2>&1 | tail -40
  ok "sweep anchors.yaml" resumable
  timeout -s TERM "$(left)" python3 -m ragtune sweep shapes/gpu_slice.yaml -o "$RES" --timeout 90 2>&1 | tail -20
  ok "sweep gpu_slice.yaml" resumable
  python3 -m ragtune plan shapes/anchors.yaml -o "$RES" --budget 8 2>&1 | tail -3
  ;;
ship)
  log "export, verify, bundle"
  dirs=("$RES"); [ -f "$RES/exhaustive/records.jsonl" ] && dirs+=("$RES/exhaustive")
  python3 -m ragtune export-lut "${dirs[@]}" -o "$RES/$SLUG.json" 2>&1 | tail -5
  ok export-lut
  timeout "$VERIFY_S" python3 -m ragtune verify "$RES/$SLUG.json" --timeout 120 > "$RES/verify.txt" 2>&1
  verified=$?; tail -30 "$RES/verify.txt"
  if [ "$verified" -eq 0 ]; then
    mkdir -p kernels/luts && cp "$RES/$SLUG.json" "kernels/luts/$SLUG.json" && log "bundled kernels/luts/$SLUG.json"
  else
    (exit "$verified"); ok "verify: the LUT is NOT bundled"
  fi
  python3 -m ragtune report "$RES" -o "$RES/report" 2>&1 | tail -3
  ok report
  ;;
tuned)
  lut=(); [ -f "kernels/luts/$SLUG.json" ] && lut=(--lut "kernels/luts/$SLUG.json")
  log "anchor benchmark, defaults${lut:+ and the verified LUT}"
  timeout "$BENCH_S" python3 benchmarks/anchors.py "${lut[@]}" --csv "$RES/anchors_tuned.csv" 2>&1 | tee "$RES/anchors_tuned.txt"
  ok "anchor benchmark"
  ;;
exhaustive)
  log "every pruned config of Mixtral fwd (resumable)"
  timeout -s TERM "$SWEEP_S" python3 -m ragtune sweep shapes/anchors.yaml -o "$RES/exhaustive" --op fwd \
    --shape 8192,4096,14336 --timeout 90 2>&1 | tail -20
  ok "exhaustive sweep" resumable
  ;;
*) echo "error: unknown stage '$STAGE' (check, sweep, ship, tuned, anchors, exhaustive)" >&2; worst=2 ;;
esac
done
