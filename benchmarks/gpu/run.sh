#!/usr/bin/env bash
# On the lent GPU machine, in one command (no network, no venv, no vLLM; $OUT comes back):
#   benchmarks/gpu/run.sh
# Installs the wheels prepared by benchmarks/gpu/prepare.sh into a scratch target (--no-index),
# then runs benchmarks/gpu/run.py with the atlas from this tree. DEVICE=cpu REHEARSAL=1 for the
# CPU rehearsal (benchmarks/gpu/rehearse.sh sets both).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
OUT=${OUT:?set OUT to the folder that comes back}
WHEELS=${WHEELS:-benchmarks/gpu/wheels}
test -f "$WHEELS/SHA256SUMS" || { echo "no prepared wheels in $WHEELS: run benchmarks/gpu/prepare.sh first (with network)" >&2; exit 2; }
(cd "$WHEELS" && sha256sum -c --quiet SHA256SUMS)
TARGET=$(mktemp -d)/site
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$TARGET" "$WHEELS"/*.whl
export PYTHONPATH="$TARGET:$PWD" HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
exec "$PY" benchmarks/gpu/run.py --out "$OUT" --device "${DEVICE:-cuda}" ${REHEARSAL:+--rehearsal}
