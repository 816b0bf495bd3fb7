#!/usr/bin/env bash
# Everything GPU-side in one run (needs CUDA devices; nothing is downloaded but vLLM in step 4):
#   1. train a larger team model on CUDA for a few minutes (same recipe as the bundled one),
#   2. measure it with our loop and with transformers' generate / generate(use_mtp=True),
#      interleaved, timed with CUDA events, and print one side-by-side table,
#   3. keep the dated record under evidence/measurements/ (that file is how results come back).
# The checkpoint stays in data/gpu-team-model/byte-mtp-12l-d512/ (gitignored: too large to commit).
# The record names it `local:byte-mtp-12l-d512` with revision = sha256 over its config, weights and
# tokenizer files: that digest, not the name, identifies the checkpoint that was measured (a
# retrained one gets a new digest).
#   4. the vLLM path: conformance suite on the CUDA build, then the team model through vLLM with
#      tensor parallelism over all visible GPUs (see step 4 below).
# Usage: benchmarks/gpu.sh [minutes]      (env: OUT=data/gpu-team-model, PY=.venv/bin/python,
#        VLLM_PACKAGE=vllm==0.32.0, VLLM_ENV=~/.cache/mtp-atlas/vllm, VLLM_DTYPE=float32)
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

# 4. vLLM (CUDA build, its own environment under ~/.cache/mtp-atlas/vllm): the conformance suite on
#    this build (dated record under evidence/conformance/), then the same team model measured
#    through vLLM with tensor parallelism over every visible GPU (record under evidence/measurements/).
#    T = 1 is measured only if this vLLM build passed the T > 0 conformance checks (atlas refuses it
#    otherwise, and the script falls back to T = 0).
VLLM_PACKAGE=${VLLM_PACKAGE:-vllm==0.32.0}
VLLM_ENV=${VLLM_ENV:-$HOME/.cache/mtp-atlas/vllm}
make vllm-env VLLM_PACKAGE="$VLLM_PACKAGE" VLLM_TORCH= VLLM_ENV="$VLLM_ENV"
export ATLAS_VLLM_PYTHON="$VLLM_ENV/bin/python"
GPUS=$(nvidia-smi -L | wc -l)
# the team model's 8 heads split evenly over 1, 2, 4 or 8 GPUs; use the largest of those that fits
TP=1; for n in 2 4 8; do [ "$GPUS" -ge "$n" ] && TP=$n; done
"$ATLAS" conformance run --dtype "${VLLM_DTYPE:-float32}"
VLLM_RUN=("$ATLAS" measure run --engine vllm --model "$MODEL" --tensor-parallel-size "$TP" --dtype float32
          --draft-tokens 1,2,3 --repeats 5 --max-new-tokens 256 --prompts-per-workload 3
          --engine-option gpu_memory_utilization=0.4)
"${VLLM_RUN[@]}" --temperatures 0,1 || "${VLLM_RUN[@]}" --temperatures 0
"$ATLAS" conformance show
