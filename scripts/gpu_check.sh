#!/usr/bin/env bash
# The GPU check in one go (bench/gpu_check.py): fine-tuning on SQuAD v1.1 (plain and through torchrun), the fp16
# export with its parity gate and, where ONNX Runtime has CUDA, serving; one JSON record and a log under --out.
# On the GPU machine, with gpu_pack/ (scripts/gpu_pack.sh) carried along:
#   bash scripts/gpu_check.sh --out "$OUT"
# Here, on a tiny slice on the CPU (what tests/bench/test_gpu_check.py runs):
#   bash scripts/gpu_check.sh --dry-run --pack PACK --out DIR
# Python: $PYTHON, else this checkout's .venv (absent on the GPU machine), else python3.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-}
if [ -z "$python" ]; then
    if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
case " $* " in
    *" --pack "*) exec "$python" -m bench.gpu_check "$@" ;;
    *) exec "$python" -m bench.gpu_check --pack gpu_pack "$@" ;;
esac
