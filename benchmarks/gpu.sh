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
#   5. multi-GPU placement: our own loop with the layers split over every visible GPU (see placement()).
# Usage: benchmarks/gpu.sh [minutes]      (env: OUT=data/gpu-team-model, PY=.venv/bin/python,
#        VLLM_PACKAGE=vllm==0.32.0, VLLM_ENV=~/.cache/mtp-atlas/vllm, VLLM_DTYPE=float32)
#        benchmarks/gpu.sh placement      only step 5; PLACEMENT_DEVICE=cpu runs it as a CPU smoke test
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${1:-4}
OUT=${OUT:-data/gpu-team-model}
PY=${PY:-.venv/bin/python}
ATLAS=${ATLAS:-.venv/bin/atlas}
MODEL="$OUT/byte-mtp-12l-d512"

# 5. A DeepSeek-V3-layout checkpoint (MLA + MoE, random weights, real tensor names; 24 main layers at
# hidden 1024 on GPUs) measured by our loop with its layers split evenly over all visible GPUs
# (--device-map cuda:0=0-11,cuda:1=12-23 for two): each GPU keeps its own layers' static caches and
# only one hidden row per token crosses a boundary. fp32, so greedy output must match plain decoding.
# The record (settings.placement says which GPU held which layers) goes to evidence/measurements/.
placement() {
    local device=${PLACEMENT_DEVICE:-cuda} gpus=1 depth=24 hidden=1024 tokens=128 repeats=5 out=evidence/measurements
    if [ "$device" = cuda ]; then
        gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
    else  # CPU smoke test of the same path: tiny model, short run, scratch output
        depth=4 hidden=128 tokens=16 repeats=1 out=$(mktemp -d)
    fi
    local ckpt="$OUT/deepseek-v3-layout-${depth}l-d${hidden}"
    "$PY" -c "
import sys
from pathlib import Path
from atlas.checkpoints.oracles import write_checkpoint
write_checkpoint('deepseek_v3', Path(sys.argv[1]), 'random', depth=$depth, overrides=dict(
    hidden_size=$hidden, intermediate_size=4 * $hidden, moe_intermediate_size=$hidden // 2, num_attention_heads=8,
    num_key_value_heads=8, n_routed_experts=8, q_lora_rank=$hidden // 2, kv_lora_rank=$hidden // 4,
    qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64, max_position_embeddings=4096))
" "$ckpt"
    local plan="" per=$(( (depth + gpus - 1) / gpus )) first=0 i=0
    while [ "$first" -lt "$depth" ]; do
        local last=$(( first + per - 1 < depth - 1 ? first + per - 1 : depth - 1 ))
        local name=$([ "$device" = cuda ] && echo "cuda:$i" || echo cpu)
        plan="${plan:+$plan,}$name=$first-$last"
        first=$(( last + 1 )) i=$(( i + 1 ))
    done
    echo "placement over $gpus device(s): $plan"
    "$ATLAS" measure run --model "$ckpt" --device-map "$plan" --dtype float32 --temperatures 0,1 --draft-tokens 1,2,3 \
        --max-new-tokens "$tokens" --repeats "$repeats" --prompts-per-workload 1 --no-peer --out "$out"
}

if [ "${1:-}" = placement ]; then
    placement
    exit 0
fi

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

# 5. multi-GPU placement with our own loop
placement
