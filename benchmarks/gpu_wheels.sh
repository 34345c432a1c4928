#!/usr/bin/env bash
# Wheels that the GPU machine lacks, for a machine with no package index.
#
#   bash benchmarks/gpu_wheels.sh                  # here, with PyPI: fetch them into .whl/
#   bash benchmarks/gpu_wheels.sh --install DIR    # there: install .whl/*.whl into DIR (no index, no deps)
#
# Then, in the same shell there: export PYTHONPATH=$PWD:DIR. benchmarks/gpu_run.sh does both steps itself.
#
# The target image (Python 3.12, jax 0.11.2 with the CUDA 13 plugin) already has numpy, typer, rich,
# pandas, pyyaml, pytest, hypothesis, matplotlib, absl-py, filelock, tqdm, protobuf and tabulate.
# What it lacks is below, pinned so that pydantic and pydantic-core match. typing-extensions rides
# along because pydantic needs a newer one than some images have.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(
  tune-jax==0.8.3
  pydantic==2.14.3
  pydantic-core==2.50.4
  annotated-types==0.8.0
  typing-inspection==0.4.5
  typing-extensions==4.16.0
)
DIR=.whl
PY=${PYTHON:-python3}  # the interpreter that will import them (3.12 there)

if [ "${1:-}" = "--install" ]; then
  target=${2:?usage: gpu_wheels.sh --install DIR}
  ls "$DIR"/*.whl >/dev/null 2>&1 || { echo "error: $DIR/ has no wheels; run 'bash benchmarks/gpu_wheels.sh' where PyPI is reachable and carry $DIR" >&2; exit 2; }
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$target" "$DIR"/*.whl
  echo "installed $(ls "$DIR"/*.whl | wc -l) wheels into $target"
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
