#!/usr/bin/env bash
# The first check of ragtune on an NVIDIA GPU (an H100 or H200), in one run of about 8 minutes,
# on a machine with Python, jax with CUDA and most of ragtune's dependencies but no package
# index (benchmarks/README.md, "One GPU run"):
#
#   bash benchmarks/gpu_wheels.sh          # once, where PyPI is reachable: the wheels it lacks, into .whl/
#   bash benchmarks/gpu_run.sh             # there, in the checkout with .whl/: every step below, in order
#   bash benchmarks/gpu_run.sh STEP ...    # setup, versions, then only these, e.g. `tests` or `sweep verify export`
#
# Planned time per step. Each step runs under `timeout` with a cap (the variable beside it
# changes it; for most steps the plan is the cap); one that overruns is stopped, and the next
# one starts:
#
#   step        plan  cap   variable      what
#   setup       0:15  1:00  SETUP_S       .whl/ into $SITE (pip --no-index --no-deps --target), once a machine
#   versions    0:15  0:30  VERSIONS_S    nvidia-smi, jax, jaxlib, the CUDA plugin, CUDA, cuDNN, triton, tokamax
#   tests       1:35  1:35  TESTS_S       tests/kernels/test_gpu_compiled.py: TEST_JOBS (4) pytest processes at
#                                         once, TEST_TIMEOUT (60) s a test; after a hang the rest go on
#   bench-fwd   2:00  2:00  BENCH_FWD_S   ragtune bench, fwd: [96,64]x[4,64,80], then the anchors
#                                         (shapes/anchors.yaml: Mixtral 8x7B prefill, DeepSeek-V3 decode, up
#                                         and down): the LUT's choice, each backend's default, XLA, tokamax
#                                         and a dense matmul of the same FLOPs
#   bench-dlhs  1:00  1:00  BENCH_DLHS_S  the same problems' dlhs
#   bench-drhs  0:50  0:50  BENCH_DRHS_S  and their drhs
#   sweep       0:45  0:45  SWEEP_S       shapes/smoke.yaml --budget SWEEP_BUDGET (4) into results/<slug>/smoke;
#                                         resumable: stopped at its cap it keeps its rows, the next run goes on
#   export      0:05  0:15  EXPORT_S      ragtune export-lut -> results/<slug>/smoke/<slug>.json
#   verify      0:40  0:40  VERIFY_S      ragtune verify of that LUT (fresh and adversarial group sizes)
#   summary     0:05                      the step table and the bench table, last
#   total       7:30  8:40
#
# Steps for longer jobs, not in the default run: anchors-sweep (ANCHORS_SHAPES, default
# shapes/anchors.yaml, fwd first, --budget ANCHORS_BUDGET (8), then SLICE_SHAPES, default
# shapes/gpu_slice.yaml, empty for none; ANCHORS_BACKENDS, e.g. mosaic_gpu, narrows both to
# those backends; ANCHORS_SWEEP_S in all, resumable, into results/<slug>/; ANCHORS_ROW_TIMEOUT
# (90) s a candidate), ship (export that folder, verify it with SHIP_ROW_TIMEOUT (120) s a draw
# and SHIP_VERIFY_S in all, bundle kernels/luts/<slug>.json only if verify passes, else rename the
# export <slug>.unverified.json, out of the bench steps' way), exhaustive (every
# pruned config of Mixtral fwd into results/<slug>/exhaustive/, resumable), band-probe
# (benchmarks/band_probe.py: the Mosaic forward's bands with and without narrow cells on the
# prefill anchors, BAND_S (180) s, starting no problem in its last minute; BAND_ARGS: its
# options). A tuned run puts
# the bench steps after ship, so that their LUT rows are the new LUT's:
#   ANCHORS_BACKENDS=mosaic_gpu bash benchmarks/gpu_run.sh anchors-sweep ship bench-fwd
#
# Output: every step writes into $OUT (default /tmp/ragtune-out) as soon as it has a result:
# versions.txt, tests.txt and tests.json (tests-*.log: pytest's own output), bench-{fwd,dlhs,drhs}.csv
# (a line per variant, written after each problem), sweep.log, verify.log, export.log, lut-smoke.json,
# steps.tsv (a line per step as it ends) and summary.txt; copies of the results go to
# results/<slug>/gpu-run/, and results.tgz packs results/<slug>/ (and kernels/luts/): unpack it in the
# checkout before the next run (tar xzf results.tgz) so a sweep resumes. Exit status: 0 if every
# step passed, 1 if any failed, 130 if a signal stopped the run; a failed step never stops the
# steps after it.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
START=$SECONDS
exec 3>&1 4>&2  # the console, for what on_signal and finish print
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/ragtune-out}
SITE=${RAGTUNE_SITE:-/tmp/site}
SETUP_S=${SETUP_S:-60} VERSIONS_S=${VERSIONS_S:-30} TESTS_S=${TESTS_S:-95}
BENCH_FWD_S=${BENCH_FWD_S:-120} BENCH_DLHS_S=${BENCH_DLHS_S:-60} BENCH_DRHS_S=${BENCH_DRHS_S:-50}
SWEEP_S=${SWEEP_S:-45} VERIFY_S=${VERIFY_S:-40} EXPORT_S=${EXPORT_S:-15} BAND_S=${BAND_S:-180} BAND_ARGS=${BAND_ARGS:-}
TEST_JOBS=${TEST_JOBS:-4} TEST_TIMEOUT=${TEST_TIMEOUT:-60} SWEEP_BUDGET=${SWEEP_BUDGET:-4} ROW_TIMEOUT=${ROW_TIMEOUT:-30}
ANCHORS_SWEEP_S=${ANCHORS_SWEEP_S:-330} SHIP_VERIFY_S=${SHIP_VERIFY_S:-300}
ANCHORS_SHAPES=${ANCHORS_SHAPES:-shapes/anchors.yaml} SLICE_SHAPES=${SLICE_SHAPES-shapes/gpu_slice.yaml}
ANCHORS_BACKENDS=${ANCHORS_BACKENDS:-} ANCHORS_BUDGET=${ANCHORS_BUDGET:-8}
ANCHORS_ROW_TIMEOUT=${ANCHORS_ROW_TIMEOUT:-90} SHIP_ROW_TIMEOUT=${SHIP_ROW_TIMEOUT:-120}
GPU_TESTS=${GPU_TESTS:-tests/kernels/test_gpu_compiled.py}
DEFAULT_STEPS=(tests bench-fwd bench-dlhs bench-drhs sweep export verify)
OTHER_STEPS=(anchors-sweep ship exhaustive band-probe)
STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || STEPS=("${DEFAULT_STEPS[@]}")
for s in "${STEPS[@]}"; do
  case " setup versions ${DEFAULT_STEPS[*]} ${OTHER_STEPS[*]} " in
  *" $s "*) ;;
  *) echo "error: unknown step '$s'; steps: ${DEFAULT_STEPS[*]} ${OTHER_STEPS[*]}" >&2; exit 2 ;;
  esac
done

mkdir -p "$OUT"
RESULTS=(versions.txt tests.txt tests.json bench-fwd.csv bench-dlhs.csv bench-drhs.csv band_probe.csv lut-smoke.json steps.tsv
  summary.txt)
# $OUT and results/<slug>/gpu-run/ hold this run's files only: an earlier run's go first.
(cd "$OUT" && rm -f "${RESULTS[@]}" slug results.tgz summary.err setup.log versions.log tests.log tests-*.log \
  tests-*.jsonl bench-*.log bench-shapes.yaml sweep.log export.log verify.log anchors-sweep.log ship.log exhaustive.log \
  band-probe.log)
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}
log() { echo "== $(date -u +%H:%M:%S) +$((SECONDS - START))s $*"; }
# jax's and XLA's start-up chatter, left out of what the console shows (the logs keep it)
quiet() { grep -v -E '^(WARNING: All log messages|I0000 |W0000 |E0000 )|cudart_stub' || true; }
show() { [ -f "$1" ] && quiet < "$1" | tail -n "${2:-15}" | sed 's/^/   /'; }

if nvidia-smi -L > /dev/null 2>&1; then
  export JAX_PLATFORMS=${JAX_PLATFORMS:-cuda,cpu}  # a CUDA that does not start is an error, not a CPU run
  export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
else
  log "no NVIDIA GPU here (nvidia-smi): the steps run on jax's default device; on a CPU the kernels are interpreted and nothing is timed"
fi

worst=0
SLUG=unknown-device
RES=results/$SLUG
CURRENT=""  # the process (and process group) of the command running now
STEP=""  # the step running now and when it started: "NAME SECONDS"
SETSID=()  # setsid -w: waits, passing the status on, should it ever need to fork
if setsid -w true 2> /dev/null; then SETSID=(setsid -w); elif command -v setsid > /dev/null; then SETSID=(setsid); fi

# capped [--parent-only] CAP CMD...: CMD under `timeout CAP`, in a session of its own, so that
# this script alone decides what a signal stops. --parent-only: at the cap only CMD gets SIGTERM
# (`timeout --foreground`), for the ragtune commands that run worker processes: a sweep then
# stops at a safe point and ends its workers itself; signalling the workers too would record the
# row in flight as a crash ("worker killed by SIGTERM"), which a resumed sweep never measures
# again. KILL follows 10 s after TERM, and whatever is left of the command's process group after
# it ends is killed, so no stray worker keeps the GPU's memory from the next step.
capped() {
  local fg=() cap rc
  if [ "$1" = --parent-only ]; then fg=(--foreground); shift; fi
  cap=$1; shift
  "${SETSID[@]}" timeout "${fg[@]}" -k 10 "$cap" "$@" &
  CURRENT=$!
  wait "$CURRENT"
  rc=$?
  kill -KILL -- "-$CURRENT" 2> /dev/null
  CURRENT=""
  return "$rc"
}
# SIGINT or SIGTERM to this script (Ctrl-C, a batch system's time limit): stop the command
# running now as its cap would, then write the summary and pack the results (finish).
on_signal() {
  exec 1>&3 2>&4  # the console again: a signal lands inside a step's redirection to its log
  log "stopped by a signal: ending the step that runs now"
  if [ -n "$CURRENT" ]; then
    kill -TERM "$CURRENT" 2> /dev/null
    for _ in $(seq 24); do kill -0 "$CURRENT" 2> /dev/null || break; sleep 0.5; done
    kill -KILL -- "-$CURRENT" 2> /dev/null
  fi
  [ -n "$STEP" ] && printf '%s\t%s\t%s\t%s\t%s\t%s\n' "${STEP%% *}" "" "" "$((SECONDS - ${STEP##* }))" 130 \
    "STOPPED by a signal" >> "$OUT/steps.tsv"
  worst=130
  exit 130
}
trap on_signal INT TERM

# step NAME PLANNED CAP RESUMABLE FUNCTION: runs FUNCTION CAP (its commands run `capped`), notes
# how it went in $OUT/steps.tsv, copies its results into $RES/gpu-run/, never stops the run.
step() {
  local name=$1 planned=$2 cap=$3 resumable=$4 fn=$5 t0=$SECONDS rc status
  log "[$name] start, planned ${planned}s, cap ${cap}s"
  STEP="$name $t0"
  "$fn" "$cap"
  rc=$?
  STEP=""
  if [ "$rc" -eq 0 ]; then
    status=ok
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    if [ "$resumable" = resumable ]; then status="stopped at cap, resumable"; else status="FAILED: over its cap"; worst=1; fi
  elif [ "$name" = tests ] && [ "$rc" -eq 3 ]; then
    status="INCOMPLETE: not all run"; worst=1
  else
    status="FAILED (exit $rc)"; worst=1
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$planned" "$cap" "$((SECONDS - t0))" "$rc" "$status" >> "$OUT/steps.tsv"
  keep
  log "[$name] $status, $((SECONDS - t0))s"
}
# The results among $OUT's files, copied to $RES/gpu-run/ (the logs stay in $OUT).
keep() {
  [ "$SLUG" = unknown-device ] && return 0  # before versions names the device: $OUT only
  mkdir -p "$RES/gpu-run"
  local f
  for f in "${RESULTS[@]}"; do
    [ -f "$OUT/$f" ] && cp "$OUT/$f" "$RES/gpu-run/$f"
  done
  return 0
}
pack() {
  [ -d "$RES" ] || { log "no results/<slug>/ to pack (the device was not named): the results are in $OUT"; return 0; }
  local what=("$RES")
  [ -n "$(ls kernels/luts/*.json 2> /dev/null)" ] && what+=(kernels/luts)
  if tar czf "$OUT/results.tgz" --exclude='*.lock' --exclude=logs "${what[@]}" 2> /dev/null; then
    log "packed ${what[*]} into $OUT/results.tgz"
  else
    log "FAILED to pack ${what[*]} into $OUT/results.tgz"; worst=1
  fi
}
finish() {
  trap - INT TERM
  exec 1>&3 2>&4
  if [ -f "$OUT/steps.tsv" ]; then
    timeout 60 "$PY" benchmarks/gpu_run.py report --out "$OUT" --res "$RES" 2> "$OUT/summary.err" || log "the summary failed: $OUT/summary.err"
    keep
  fi
  pack
  log "done in $((SECONDS - START))s, exit $worst; everything is in $OUT"
  exit "$worst"
}
trap finish EXIT

# --- the steps (each takes its cap in seconds) ------------------------------------------------

setup_() {
  # The wheels the machine lacks (benchmarks/gpu_wheels.sh), installed once a machine: again
  # only when .whl/ holds other files than the ones installed.
  local have want
  want=$(find .whl -maxdepth 1 -name '*.whl' -printf '%f\n' 2> /dev/null | sort | tr '\n' ' ')
  have=$(cat "$SITE/.gpu_run_wheels" 2> /dev/null)
  if [ -z "$want" ]; then
    echo "no .whl/ here: using the packages $PY has" | tee "$OUT/setup.log"
    "$PY" -c "import pydantic, tune_jax" >> "$OUT/setup.log" 2>&1 && return 0
    echo "and it lacks pydantic or tune-jax: run benchmarks/gpu_wheels.sh where PyPI is reachable and carry .whl/" | tee -a "$OUT/setup.log"
    return 2
  fi
  if [ "$want" = "$have" ]; then
    echo "the wheels of .whl/ are already in $SITE" | tee "$OUT/setup.log"
    return 0
  fi
  [ -f "$SITE/.gpu_run_wheels" ] && rm -rf "$SITE"  # a folder this script filled: start it afresh
  capped "$1" env PYTHON="$PY" bash benchmarks/gpu_wheels.sh --install "$SITE" > "$OUT/setup.log" 2>&1 || { show "$OUT/setup.log" 10; return 1; }
  echo "$want" > "$SITE/.gpu_run_wheels"
  show "$OUT/setup.log" 3
}

versions_() {
  capped "$1" "$PY" benchmarks/gpu_run.py versions --out "$OUT/versions.txt" --slug-file "$OUT/slug" > "$OUT/versions.log" 2>&1
  local rc=$?
  quiet < "$OUT/versions.log" | sed 's/^/   /'
  return $rc
}

tests_() {
  # The helper stops its pytest processes at its own deadline; the cap is the backstop.
  # shellcheck disable=SC2086  # GPU_TESTS: files, space-separated
  capped "$(($1 + 10))" "$PY" benchmarks/gpu_run.py tests --out "$OUT" --deadline "$(($1 - 3))" \
    --timeout "$TEST_TIMEOUT" --jobs "$TEST_JOBS" $GPU_TESTS > "$OUT/tests.log" 2>&1
  local rc=$?
  show "$OUT/tests.log" 20
  return $rc
}

bench_() {  # CAP OP SHAPES_FILE
  capped "$1" "$PY" -m ragtune bench "$3" --op "$2" --csv "$OUT/bench-$2.csv" > "$OUT/bench-$2.log" 2>&1
  local rc=$?
  show "$OUT/bench-$2.log" 40
  return $rc
}
# Each op on the small problem, then the anchors (one shapes file, written once a run).
bench_op_() {  # CAP OP
  [ -f "$OUT/bench-shapes.yaml" ] || "$PY" benchmarks/gpu_run.py bench-shapes --out "$OUT/bench-shapes.yaml" || return 2
  bench_ "$1" "$2" "$OUT/bench-shapes.yaml"
}
bench_fwd_() { bench_op_ "$1" fwd; }
bench_dlhs_() { bench_op_ "$1" dlhs; }
bench_drhs_() { bench_op_ "$1" drhs; }

sweep_() {
  capped --parent-only "$1" "$PY" -m ragtune sweep shapes/smoke.yaml -o "$RES/smoke" --budget "$SWEEP_BUDGET" \
    --timeout "$ROW_TIMEOUT" > "$OUT/sweep.log" 2>&1
  local rc=$?
  show "$OUT/sweep.log" 15
  return $rc
}

# export-lut before verify: verify given a folder checks the LUT file in it when there is one,
# which before this run's export is the last run's.
export_() {
  capped "$1" "$PY" -m ragtune export-lut "$RES/smoke" -o "$RES/smoke/$SLUG.json" > "$OUT/export.log" 2>&1
  local rc=$?
  [ -f "$RES/smoke/$SLUG.json" ] && cp "$RES/smoke/$SLUG.json" "$OUT/lut-smoke.json"
  show "$OUT/export.log" 8
  return $rc
}

verify_() {
  capped --parent-only "$1" "$PY" -m ragtune verify "$RES/smoke/$SLUG.json" --timeout "$ROW_TIMEOUT" > "$OUT/verify.log" 2>&1
  local rc=$?
  show "$OUT/verify.log" 15
  return $rc
}

anchors_sweep_() {
  local end=$((SECONDS + $1)) rc pick=()
  left() { local l=$((end - SECONDS)); [ "$l" -gt 5 ] && echo "$l" || echo 5; }
  [ -n "$ANCHORS_BACKENDS" ] && pick=(--backend "$ANCHORS_BACKENDS")
  : > "$OUT/anchors-sweep.log"
  capped --parent-only "$(left)" "$PY" -m ragtune sweep "$ANCHORS_SHAPES" -o "$RES" "${pick[@]}" --op fwd \
    --budget "$ANCHORS_BUDGET" --timeout "$ANCHORS_ROW_TIMEOUT" >> "$OUT/anchors-sweep.log" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] || { show "$OUT/anchors-sweep.log" 15; return $rc; }
  capped --parent-only "$(left)" "$PY" -m ragtune sweep "$ANCHORS_SHAPES" -o "$RES" "${pick[@]}" \
    --budget "$ANCHORS_BUDGET" --timeout "$ANCHORS_ROW_TIMEOUT" >> "$OUT/anchors-sweep.log" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] && [ -n "$SLICE_SHAPES" ] || { show "$OUT/anchors-sweep.log" 15; return $rc; }
  capped --parent-only "$(left)" "$PY" -m ragtune sweep "$SLICE_SHAPES" -o "$RES" "${pick[@]}" --timeout "$ANCHORS_ROW_TIMEOUT" >> "$OUT/anchors-sweep.log" 2>&1
  rc=$?
  show "$OUT/anchors-sweep.log" 15
  return $rc
}

ship_() {
  local dirs=("$RES") rc
  [ -f "$RES/exhaustive/records.jsonl" ] && dirs+=("$RES/exhaustive")
  "$PY" -m ragtune export-lut "${dirs[@]}" -o "$RES/$SLUG.json" > "$OUT/ship.log" 2>&1 || { show "$OUT/ship.log"; return 1; }
  capped --parent-only "$1" "$PY" -m ragtune verify "$RES/$SLUG.json" --timeout "$SHIP_ROW_TIMEOUT" >> "$OUT/ship.log" 2>&1
  rc=$?
  show "$OUT/ship.log" 30
  if [ "$rc" -ne 0 ]; then
    # Out of the way of the bench steps after this one, which would take it for the LUT.
    mv -f "$RES/$SLUG.json" "$RES/$SLUG.unverified.json"
    echo "not bundled: verify failed; the export is now $RES/$SLUG.unverified.json" | tee -a "$OUT/ship.log"
    return $rc
  fi
  if [ "$SLUG" = cpu ]; then  # an interpreter's times rank nothing: a CPU trial ships no LUT
    echo "not bundled: a CPU's times are the interpreter's ($RES/$SLUG.json stays where it is)" | tee -a "$OUT/ship.log"
    return 0
  fi
  mkdir -p kernels/luts && cp "$RES/$SLUG.json" "kernels/luts/$SLUG.json" || return 1
  echo "bundled kernels/luts/$SLUG.json" | tee -a "$OUT/ship.log"
}

exhaustive_() {
  capped --parent-only "$1" "$PY" -m ragtune sweep shapes/anchors.yaml -o "$RES/exhaustive" --op fwd \
    --shape 8192,4096,14336 --timeout 90 > "$OUT/exhaustive.log" 2>&1
  local rc=$?
  show "$OUT/exhaustive.log" 20
  return $rc
}

band_probe_() {
  # shellcheck disable=SC2086  # BAND_ARGS: options, e.g. --op dlhs, or --tiny for a CPU trial
  capped "$1" env OUT="$OUT" DEADLINE="$(($1 - 60))" "$PY" benchmarks/band_probe.py $BAND_ARGS > "$OUT/band-probe.log" 2>&1
  local rc=$?
  show "$OUT/band-probe.log" 45
  return $rc
}

# --- the run ------------------------------------------------------------------------------------

step setup 15 "$SETUP_S" no setup_
step versions 15 "$VERSIONS_S" no versions_
SLUG=$(cat "$OUT/slug" 2> /dev/null || echo unknown-device)
RES=results/$SLUG
if [ "$SLUG" = unknown-device ]; then
  log "versions could not name the device: the results stay in $OUT"
else
  mkdir -p "$RES/gpu-run"
  (cd "$RES/gpu-run" && rm -f "${RESULTS[@]}")
  keep
fi
for s in "${STEPS[@]}"; do
  case "$s" in
  setup | versions) ;;  # done above
  tests) step tests "$TESTS_S" "$TESTS_S" no tests_ ;;
  bench-fwd) step bench-fwd "$BENCH_FWD_S" "$BENCH_FWD_S" no bench_fwd_ ;;
  bench-dlhs) step bench-dlhs "$BENCH_DLHS_S" "$BENCH_DLHS_S" no bench_dlhs_ ;;
  bench-drhs) step bench-drhs "$BENCH_DRHS_S" "$BENCH_DRHS_S" no bench_drhs_ ;;
  sweep) step sweep "$SWEEP_S" "$SWEEP_S" resumable sweep_ ;;
  export) step export 5 "$EXPORT_S" no export_ ;;
  verify) step verify "$VERIFY_S" "$VERIFY_S" no verify_ ;;
  anchors-sweep) step anchors-sweep "$ANCHORS_SWEEP_S" "$ANCHORS_SWEEP_S" resumable anchors_sweep_ ;;
  ship) step ship "$SHIP_VERIFY_S" "$SHIP_VERIFY_S" no ship_ ;;
  exhaustive) step exhaustive "$ANCHORS_SWEEP_S" "$ANCHORS_SWEEP_S" resumable exhaustive_ ;;
  band-probe) step band-probe "$BAND_S" "$BAND_S" no band_probe_ ;;
  esac
done
