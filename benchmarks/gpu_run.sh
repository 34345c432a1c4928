#!/usr/bin/env bash
# GPU work in stages, one device call each (a call may run 10 minutes; plan 30 minutes in all).
#
# Here, once, where PyPI is reachable:   bash benchmarks/gpu_wheels.sh      (writes .whl/)
# Each device call, carrying .whl:       bash benchmarks/gpu_run.sh STAGE
#
#   check    versions, the kernel tests compiled on the GPU, the ceilings, the timer   (~5 min)
#   anchors  benchmarks/anchors.py with default configs: kernels vs XLA vs dense       (~6 min)
#   sweep    shapes/anchors.yaml then shapes/gpu_slice.yaml, budgeted; stops itself
#            before the call's limit and resumes on the next call                       (~9 min)
#   ship     export-lut, verify the LUT, bundle it in kernels/luts/ only if it passes,
#            anchors.py with the LUT, report                                            (~8 min)
#   exhaustive  every pruned config of Mixtral fwd, resumable across calls and sessions
#
# Results: results/<device-slug>/ here is the sweep's folder. Each stage packs it, with its
# logs, into $OUT/results.tgz; unpack that into the checkout before the next call
# (tar xzf results.tgz), so a fresh machine resumes where the last one stopped.
# Without the device tool, OUT defaults to /tmp/ragtune-out.
set -uo pipefail
cd "$(dirname "$0")/.."
STAGE=${1:?usage: gpu_run.sh check|anchors|sweep|ship|exhaustive}
OUT=${OUT:-/tmp/ragtune-out}
SITE=${RAGTUNE_SITE:-/tmp/site}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "== $(date -u +%H:%M:%S) $*"; }

[ -d "$SITE/pydantic" ] || bash benchmarks/gpu_wheels.sh --install "$SITE" || exit 2
export PYTHONPATH=$PWD:$SITE
SLUG=$(python3 -c "import kernels; print(kernels.device_slug(kernels.current_device_kind()))") || exit 2
RES=results/$SLUG
mkdir -p "$RES"
pack() { tar czf "$OUT/results.tgz" "$RES" kernels/luts 2>/dev/null; log "packed $RES into \$OUT/results.tgz"; }
trap pack EXIT

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
  log "kernel tests, compiled on the GPU"
  timeout 330 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
    tests/test_gpu_compiled.py tests/test_timing.py tests/test_kernels_forward.py tests/test_kernels_grad.py \
    -k "not pallas_tpu" 2>&1 | tail -40 | tee "$RES/tests.txt"
  log "ceilings"
  python3 - <<'PY' 2>&1 | tee -a "$RES/device.txt"
import jax
from pathlib import Path
import kernels
from ragtune import ceilings
dev = jax.devices()[0]
c = ceilings.measure_ceilings(["bfloat16", "float16"], dev.platform)
ceilings.save(Path("results") / kernels.device_slug(dev.device_kind), {"device_kind": dev.device_kind, "jax_version": jax.__version__}, c)
print("ceilings:", c)
PY
  ;;
anchors)
  log "anchor benchmark, default configs"
  timeout 540 python3 benchmarks/anchors.py --csv "$RES/anchors_default.csv" 2>&1 | tee "$RES/anchors_default.txt"
  ;;
sweep)
  log "sweep the anchors, then the GPU slice (SIGTERM keeps the rows; the next call resumes)"
  timeout -s TERM 330 python3 -m ragtune sweep shapes/anchors.yaml -o "$RES" --budget 12 --timeout 90 2>&1 | tail -40
  timeout -s TERM 180 python3 -m ragtune sweep shapes/gpu_slice.yaml -o "$RES" --timeout 90 2>&1 | tail -20
  python3 -m ragtune plan shapes/anchors.yaml -o "$RES" --budget 12 2>&1 | tail -5
  ;;
ship)
  log "export, verify, bundle"
  python3 -m ragtune export-lut "$RES" 2>&1 | tail -5
  if timeout 300 python3 -m ragtune verify "$RES/$SLUG.json" --timeout 120 2>&1 | tee "$RES/verify.txt" | tail -30; then
    mkdir -p kernels/luts && cp "$RES/$SLUG.json" "kernels/luts/$SLUG.json" && log "bundled kernels/luts/$SLUG.json"
  else
    log "verify FAILED: the LUT is not bundled"
  fi
  log "anchor benchmark with the LUT"
  timeout 240 python3 benchmarks/anchors.py --lut "$RES/$SLUG.json" --csv "$RES/anchors_tuned.csv" 2>&1 | tee "$RES/anchors_tuned.txt"
  python3 -m ragtune report "$RES" -o "$RES/report" 2>&1 | tail -3
  ;;
exhaustive)
  log "every pruned config of Mixtral fwd (resumable)"
  timeout -s TERM 560 python3 -m ragtune sweep shapes/anchors.yaml -o "$RES/exhaustive" --op fwd \
    --shape 8192,4096,14336 --timeout 90 2>&1 | tail -20
  ;;
*) echo "error: unknown stage '$STAGE' (check, anchors, sweep, ship, exhaustive)" >&2; exit 2 ;;
esac
