#!/usr/bin/env bash
# The verify criterion on other CPUs' kernels: the AOTInductor and verify tests under each ATEN_CPU_CAPABILITY below
# this CPU's best (the suite itself runs at the best). Not in .ci/run: the two reruns cost about 12 min on 2 cores
# beside the suite, past CI's 25; tests/test_criterion_kernels.py runs in the suite under each capability instead
# (the Inductor criterion, and warmup then verify of a tiny AOTInductor manifest).
# Run from the checkout's root with the test command's .venv:  tools/ci/capability_tests.sh
# A basetemp of their own, so that a suite running beside them keeps its folders, and an Inductor cache of their own:
# torch's FX graph cache key leaves out the vector ISA, and a warmup on a folder claimed for another is refused.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONSAFEPATH=1 WARMCACHE_TEST_POSTGRES_URL=${WARMCACHE_TEST_POSTGRES_URL:-postgresql://postgres@127.0.0.1:5432/test}
best=$(.venv/bin/python -c 'import torch; print(torch.backends.cpu.get_cpu_capability().lower())')
for capability in default avx2 avx512; do
  [ "$capability" = "$best" ] && break
  echo "--- ATEN_CPU_CAPABILITY=$capability (this CPU's best: $best)"
  ATEN_CPU_CAPABILITY=$capability TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)" .venv/bin/python -m pytest -q -p no:cacheprovider --basetemp="$(mktemp -d)" \
    tests/test_aotinductor.py tests/test_verify.py
done
