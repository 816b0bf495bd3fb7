#!/usr/bin/env bash
# Everything GPU-side in one run (needs one CUDA device; nothing is downloaded):
#   1. train a larger team model on CUDA for a few minutes (same recipe as the bundled one),
#   2. measure it with our loop and with transformers' generate / generate(use_mtp=True),
#      interleaved, timed with CUDA events, and print one side-by-side table,
#   3. keep the dated record under evidence/measurements/ (that file is how results come back).
# The checkpoint stays in data/gpu-team-model/byte-mtp-12l-d512/ (gitignored: too large to commit).
# The record names it `local:byte-mtp-12l-d512` with revision = sha256 over its config, weights and
# tokenizer files: that digest, not the name, identifies the checkpoint that was measured (a
# retrained one gets a new digest).
# Usage: benchmarks/gpu.sh [minutes]      (env: OUT=data/gpu-team-model, PY=.venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${1:-4}
OUT=${OUT:-data/gpu-team-model}
PY=${PY:-.venv/bin/python}
ATLAS=${ATLAS:-.venv/bin/atlas}
MODEL="$OUT/byte-mtp-12l-d512"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "torch sees no CUDA device (CPU build of torch?)")'

# 1. a deeper, wider byte-level Mellum with one MTP layer; --minutes bounds the wall time
"$ATLAS" team-model --device cuda --minutes "$MINUTES" --layers 12 --hidden 512 --heads 8 --kv-heads 8 \
    --intermediate 1536 --seq-len 512 --batch-size 32 --out "$MODEL"

# 2 + 3. the real runner (fp32: greedy output must match plain decoding token for token), the table,
# and the record kept in evidence/measurements/
"$PY" benchmarks/measure.py --model "$MODEL" --device cuda --dtype float32 --repeats 5 \
    --max-new-tokens 256 --prompts-per-workload 3 --out evidence/measurements
