#!/usr/bin/env bash
# CUDA check of AOTInductor decode packages (tests/test_aotinductor.py -k cuda) on a GPU host.
#
# Runs from the repository root; writes env.txt and pytest.txt (with the served figures) under $OUT
# (default ./cuda-aoti-out). A host without network gets the Python packages it lacks as wheels in
# .whl/ (see docs/guides/precompiled.md for the download command); they are
# installed into /tmp/site, the repository itself is used from its checkout (no build step).
set -uo pipefail
OUT=${OUT:-$PWD/cuda-aoti-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
# Run from the checkout, not an install: the wheel maps migrations/ to warmcache._migrations, so link it the same way.
[ -e warmcache/_migrations ] || ln -s ../migrations warmcache/_migrations
export PYTHONPATH=$PWD:$PWD/tests/support${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
{
    nvidia-smi -L
    "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'transformers', transformers.__version__)"
} 2>&1 | tee "$OUT/env.txt"
"$PY" -m pytest tests/test_aotinductor.py -k cuda -s -rs -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest.txt"
