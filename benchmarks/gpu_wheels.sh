#!/usr/bin/env bash
# Wheels that the GPU machine lacks, for a machine with no package index.
#
#   bash benchmarks/gpu_wheels.sh                  # here, with PyPI: fetch them into .whl/
#   bash benchmarks/gpu_wheels.sh --install DIR    # there: install .whl/*.whl into DIR (no index, no deps)
#
# Then, in the same shell there: export PYTHONPATH=$PWD:DIR. benchmarks/gpu_run.sh does both steps itself.
#
# The target image (Python 3.12, jax 0.11.2 with the CUDA 13 plugin) already has numpy, typer, rich,
# pandas, pyyaml, pytest, pytest-timeout, hypothesis, matplotlib, absl-py, filelock, tqdm, protobuf,
# tabulate and flax. What it lacks is below, pinned so that pydantic and pydantic-core match.
# typing-extensions rides along because pydantic needs a newer one than some images have. Then
# tokamax (`ragtune bench`'s tokamax column) and what it imports that such an image lacks (its
# wheel's Requires-Dist): qwix, einshape, immutabledict, tensorboardx, jaxtyping (with
# wadler-lindig), and jax-triton for its native Triton ragged_dot (which wants triton >= 3.7: with
# an older triton that implementation is absent, and bench says so). tokamax also imports
# xprof.cli.tools.get_kernel_stats_tool when it loads, for its own profiling, which ragged_dot does
# not use: --install writes an empty stand-in for that one module instead of xprof's 32 MB wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(
  tune-jax==0.8.3
  pydantic==2.14.3
  pydantic-core==2.50.4
  annotated-types==0.8.0
  typing-inspection==0.4.5
  typing-extensions==4.16.0
  tokamax==0.0.17
  qwix==0.1.8
  einshape==1.0
  immutabledict==4.3.1
  tensorboardx==2.6.5
  jaxtyping==0.3.11
  wadler-lindig==0.1.8
  jax-triton==0.4.1
)
DIR=.whl
PY=${PYTHON:-python3}  # the interpreter that will import them (3.12 there)

if [ "${1:-}" = "--install" ]; then
  target=${2:?usage: gpu_wheels.sh --install DIR}
  ls "$DIR"/*.whl >/dev/null 2>&1 || { echo "error: $DIR/ has no wheels; run 'bash benchmarks/gpu_wheels.sh' where PyPI is reachable and carry $DIR" >&2; exit 2; }
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$target" "$DIR"/*.whl
  echo "installed $(ls "$DIR"/*.whl | wc -l) wheels into $target"
  if [ -d "$target/tokamax" ] && ! PYTHONPATH=$target "$PY" -c "import xprof.cli.tools.get_kernel_stats_tool" 2>/dev/null; then
    stub=$target/xprof/cli/tools
    mkdir -p "$stub"
    touch "$target/xprof/__init__.py" "$target/xprof/cli/__init__.py" "$stub/__init__.py"
    echo "# An empty stand-in written by benchmarks/gpu_wheels.sh: tokamax imports this module when it loads." > "$stub/get_kernel_stats_tool.py"
    echo "wrote an empty xprof.cli.tools.get_kernel_stats_tool into $target (tokamax imports it; xprof is not installed)"
  fi
  exit 0
fi

grep -qx '/.whl/' .git/info/exclude 2>/dev/null || grep -qx '/.whl/' .gitignore || echo '/.whl/' >> .git/info/exclude
mkdir -p "$DIR"
# Only the pinned set: two versions of one package stop the install there.
find "$DIR" -name '*.whl' -delete
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DIR" "${WHEELS[@]}"
echo "fetched into $DIR/ ($(du -sh "$DIR" | cut -f1)):"
ls -1 "$DIR"
