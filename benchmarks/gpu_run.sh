#!/usr/bin/env bash
# One device call that does all GPU work: versions, compiled kernel tests, a sweep of the
# smoke set and a slice of moe.yaml, verify, export, and the headline benchmark.
# Run from the repo root on the GPU machine, with the wheels it lacks in .whl/ (tune-jax, pydantic,
# pydantic-core, annotated-types, typing-inspection, typing-extensions, filelock, absl-py):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=$PWD:/tmp/site OUT=$OUT bash benchmarks/gpu_run.sh
set -uo pipefail
OUT=${OUT:-/tmp/ragtune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "== $*"; }
log versions; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/device.txt"
python3 -c "import jax; print(jax.__version__, jax.devices())" 2>&1 | tee -a "$OUT/device.txt"
SLUG=$(python3 -c "import kernels; print(kernels.device_slug(kernels.current_device_kind()))")
RES="results/$SLUG"
log "kernel tests, compiled"; timeout 240 python3 -m pytest -q -x tests/test_kernels_forward.py tests/test_kernels_grad.py 2>&1 | tail -5 | tee "$OUT/tests.txt"
log "headline benchmark"; python3 benchmarks/bench_ragged_dot.py 2>&1 | tee "$OUT/bench.txt"
# Launch orders side by side (issue: L2-aware launch order): band 1 walks a tile's columns,
# 1024 every tile of a group per column, the default in between. DeepSeek-V3 m halved to fit.
log "launch bands"; for op in fwd drhs; do for mkng in "8192 4096 14336 8" "65536 7168 2048 256" "512 7168 2048 256"; do
  set -- $mkng; timeout 120 python3 benchmarks/bench_ragged_dot.py --op $op --m $1 --k $2 --n $3 --g $4 --bands 1,16,1024 2>&1 | tail -7
done; done | tee "$OUT/bands.txt"
log "sweep smoke"; timeout 150 python3 -m ragtune sweep shapes/smoke.yaml -o "$RES" --timeout 60 2>&1 | tail -15
log "sweep moe slice"; timeout 200 python3 -m ragtune sweep shapes/gpu_slice.yaml -o "$RES" --timeout 60 2>&1 | tail -20
log verify; timeout 120 python3 -m ragtune verify "$RES" 2>&1 | grep -E "PASS|FAIL|verified" | tee "$OUT/verify.txt"
log export; python3 -m ragtune export-lut "$RES" 2>&1
python3 -m ragtune report "$RES" -o "$OUT" 2>&1
cp "$RES/records.jsonl" "$RES/$SLUG.json" "$OUT/" 2>/dev/null
