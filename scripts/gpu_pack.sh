#!/usr/bin/env bash
# Pack what the GPU check needs into gpu_pack/ (ignored by git, never committed): the base model in fp16, the SQuAD
# v1.1 files, Python 3.12 wheels the GPU image lacks (bench/gpu_pack.py). Prints the size of the pack and of the
# working tree that travels with it, and fails when the two are over the device tool's 64 MiB.
#   bash scripts/gpu_pack.sh [--data-dir DATA] [--with-hey]      (needs PyPI for the wheels)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
exec "$python" -m bench.gpu_pack --out gpu_pack "$@"
