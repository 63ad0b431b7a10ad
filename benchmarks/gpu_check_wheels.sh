#!/usr/bin/env bash
# The wheels `make gpu-check` installs on a device machine (issue #31): that machine has torch (2.11, CUDA) and many
# packages but no package registry, so what the check's programs import and it lacks travels as wheels.
#
#   bash benchmarks/gpu_check_wheels.sh [DIR]     # default out/gpu_check_wheels (git-ignored: carry it)
#
# The packages: torchtune, torchtitan, torchao (the frameworks) and what their training paths import that the
# device image does not have (found by importing both frameworks' trainers and recipes here and comparing with
# the image's package list): datasets with dill and multiprocess, omegaconf (torchtune's configs), tyro with
# docstring_parser and typeguard (torchtitan's command line), torchdata (both dataloaders), spmd_types
# (torchtitan's parallelism), nvidia-ml-py (the runtime's telemetry, #32).
# Versions: this project's pins (requirements/constraints.txt), nothing else.
# For CPython 3.12 on x86-64 Linux (the device's python3), whatever this machine runs.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-out/gpu_check_wheels}
PYTHON=${PYTHON:-.venv/bin/python}
PACKAGES="torchtune torchtitan torchao datasets dill multiprocess omegaconf tyro docstring_parser typeguard torchdata
spmd_types nvidia-ml-py"
specs=()
for p in $PACKAGES; do
  pin=$(grep -iE "^${p}==" requirements/constraints.txt || true)
  if [ -z "$pin" ]; then
    echo "gpu_check_wheels: $p has no pin in requirements/constraints.txt" >&2
    exit 1
  fi
  specs+=("$pin")
done
mkdir -p "$DIR"
rm -f "$DIR"/*.whl
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$DIR" "${specs[@]}"
ls -l "$DIR"/*.whl
echo "gpu_check_wheels: $(find "$DIR" -name '*.whl' | wc -l) wheels, $(du -ch "$DIR"/*.whl | tail -1 | cut -f1) in $DIR"
