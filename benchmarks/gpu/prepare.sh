#!/usr/bin/env bash
# Run HERE (with network), before a GPU run: download the wheels the atlas needs beyond what the
# lent GPU machine has (python3 3.12, torch, transformers and their own dependencies) into
# benchmarks/gpu/wheels/ (gitignored; it travels with `run`'s carry), and check the size budget.
#   benchmarks/gpu/prepare.sh            # cp312 wheels, for the GPU machine
#   PYVER=3.11 benchmarks/gpu/prepare.sh # the same set for this machine's python (the CPU rehearsal)
set -euo pipefail
cd "$(dirname "$0")"
PYVER=${PYVER:-3.12}
DEST=${DEST:-wheels}
BUDGET_MIB=${BUDGET_MIB:-40}
PIP=${PIP:-../../.venv/bin/pip}
# What `atlas measure run` imports beyond the machine's set (pydantic with its own needs, click;
# typing_extensions comes with torch), and transformers at the version the atlas requires: the
# machine's 5.17 has no MTP config for the team model's Mellum and an always-gated Qwen3-Next
# attention, so neither the team model nor its Qwen3-Next rewrite loads there. transformers 5.24
# accepts huggingface_hub >= 1.31: 1.33 is shipped, as the machine's older 1.x may predate that
# (its httpx is the machine's). The store's duckdb is not needed to write records. Versions: the
# project's venv, where it has them.
WHEELS=(pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 click==8.5.1
        transformers==5.24.0 huggingface-hub==1.33.0)
rm -rf "$DEST" && mkdir -p "$DEST"
"$PIP" download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST" "${WHEELS[@]}"
(cd "$DEST" && sha256sum ./*.whl > SHA256SUMS)
size=$(du -sb "$DEST" | cut -f1)
echo "prepared $(ls "$DEST"/*.whl | wc -l) wheels for python $PYVER in benchmarks/gpu/$DEST: $((size / 1048576)) MiB (budget $BUDGET_MIB MiB)"
if [ "$size" -gt $((BUDGET_MIB * 1048576)) ]; then
    echo "over the $BUDGET_MIB MiB budget" >&2
    exit 1
fi
