#!/usr/bin/env bash
# The GPU run rehearsed on this CPU machine under the lent machine's constraints:
# - a fresh venv that holds only torch, transformers 5.17 and their own dependencies (as the lent
#   machine does), plus the prepared wheels, which run.sh installs with --no-index;
# - no network (unshare -n: a fresh network namespace with no interfaces);
# - the travelling tree (tracked + untracked files + the wheels) within 64 MiB, at most 8 files back.
# This machine has python 3.11 only, so the rehearsal installs the cp311 build of the same wheel set
# (PYVER=3.11 DEST=wheels-cp311 benchmarks/gpu/prepare.sh); the GPU machine gets the cp312 one.
#   benchmarks/gpu/rehearse.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=${WHEELS:-benchmarks/gpu/wheels-cp311}
SRC_VENV=${SRC_VENV:-.venv}
WORK=$(mktemp -d /tmp/atlas-gpu-rehearsal.XXXX)
OUT="$WORK/out"
test -f "$WHEELS/SHA256SUMS" || { echo "run PYVER=3.11 DEST=wheels-cp311 benchmarks/gpu/prepare.sh first" >&2; exit 2; }

# the size budget: what `run` carries is the tree git sees plus the wheels (cp312 set, the one that travels)
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
wheels=$(du -sb benchmarks/gpu/wheels 2>/dev/null | cut -f1 || echo 0)
echo "travelling tree $((tree / 1048576)) MiB + wheels $((wheels / 1048576)) MiB (limit 64 MiB)"
test $((tree + wheels)) -le $((64 * 1048576)) || { echo "over the 64 MiB limit" >&2; exit 1; }

# the machine's preinstalled set: torch (linked from the project's venv, with what it requires) and
# transformers 5.17 with its dependencies, installed from BASE_WHEELS (fetch them once, with network:
#   .venv/bin/pip download --only-binary=:all: -d benchmarks/gpu/wheels-rehearsal-base transformers==5.17.0)
# What the prepared wheels bring is kept out of it even where a dependency would pull it in (typer
# does), so the rehearsal proves the prepared wheels suffice.
BASE_WHEELS=${BASE_WHEELS:-benchmarks/gpu/wheels-rehearsal-base}
ls "$BASE_WHEELS"/transformers-*.whl > /dev/null || { echo "no transformers wheel in $BASE_WHEELS (see above)" >&2; exit 2; }
python3 -m venv "$WORK/venv"
BASE="$WORK/base"
"$SRC_VENV/bin/python" - "$BASE" <<'PY'
import importlib.metadata as md, os, re, sys
from pathlib import Path
base = Path(sys.argv[1])
base.mkdir()
want, todo = set(), ["torch"]
while todo:
    name = re.split(r"[ ;<>=!~\[(]", todo.pop())[0].lower().replace("_", "-")
    if not name or name in want:
        continue
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    want.add(name)
    todo += [r for r in dist.requires or [] if "extra ==" not in r]
site = Path(md.distribution("torch").locate_file(""))
for name in sorted(want):
    for top in {Path(f).parts[0] for f in md.distribution(name).files or [] if not str(f).startswith("..")}:
        if (site / top).exists() and not (base / top).exists():
            os.symlink(site / top, base / top)
print("torch stack (linked):", ", ".join(sorted(want)))
PY
SHIPPED='/(pydantic|pydantic_core|annotated_types|typing_inspection|click|duckdb)-[0-9]'
"$WORK/venv/bin/python" -m pip install -q --no-index --no-deps --target "$BASE" $(ls "$BASE_WHEELS"/*.whl | grep -Ev "$SHIPPED")
echo "$BASE" > "$(ls -d "$WORK"/venv/lib/python3*/site-packages)/gpu-machine-base.pth"

start=$(date +%s)
unshare -n env -i PATH=/usr/bin:/bin HOME="$WORK" PY="$WORK/venv/bin/python" OUT="$OUT" DEVICE=cpu REHEARSAL=1 \
    WHEELS="$WHEELS" OMP_NUM_THREADS=2 benchmarks/gpu/run.sh
echo "rehearsal took $(( $(date +%s) - start )) s"
n=$(find "$OUT" -type f | wc -l)
echo "$n files in $OUT (limit 8):"; ls -la "$OUT"
test "$n" -le 8
