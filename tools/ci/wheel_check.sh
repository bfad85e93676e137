#!/usr/bin/env bash
# What users install, proven the way they install it: the sdist and the wheel built from a clean copy of the tree,
# the wheel installed (not editable) with constraints.txt into a fresh venv, and from there, outside the tree, the
# commands a user runs first: `warmcache --help`, `db upgrade`, and a tiny plan -> warmup -> verify. Then the sdist
# installs over it and answers too. An editable checkout imports folders the wheel may lack (warmcache.store.oci once
# was), so only this catches a package the wheel drops.
#
#     tools/ci/wheel_check.sh [WORKDIR]     # WORKDIR (kept, reused by a rerun) holds the copy, dist/ and the venv
#
# The venv is always new (never --system-site-packages): pip's cache and the local torch wheel ($PIP_FIND_LINKS)
# make it quick. BUILD_PYTHON is an interpreter with the `build` package (default .venv/bin/python, the test extra).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
builder=${BUILD_PYTHON:-$root/.venv/bin/python}
if [ -n "${1:-}" ]; then
  work=$(mkdir -p "$1" && cd "$1" && pwd)
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
started=$SECONDS
step() { echo "--- $* (at $((SECONDS - started)) s)"; }
# pip warns about each find-links folder it skips: its output shows only when it fails.
pip_quietly() { "$bin/pip" "$@" >"$work/pip.log" 2>&1 || { tail -30 "$work/pip.log"; exit 1; }; }

step "a clean copy of the tree: tracked and new files, no build/, *.egg-info or .venv"
rm -rf "$work/src" "$work/dist" "$work/venv" "$work/run"
mkdir -p "$work/src" "$work/run"
(
  cd "$root"
  git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' file; do
    [ -f "$file" ] && printf '%s\0' "$file"  # a tracked file deleted in the working tree is not part of it
  done | tar --null -T - -cf -
) | tar -xf - -C "$work/src"

step "the sdist, and the wheel built from it (so the sdist holds all the wheel needs)"
"$builder" -m build --outdir "$work/dist" "$work/src" >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
sdist=$(echo "$work"/dist/warmcache-*.tar.gz)
wheel=$(echo "$work"/dist/warmcache-*.whl)
[ -f "$sdist" ] && [ -f "$wheel" ] || { echo "wheel_check: no sdist or wheel in $work/dist" >&2; exit 1; }

step "a fresh venv with the wheel and constraints.txt"
python3 -m venv "$work/venv"
bin=$work/venv/bin
pip_quietly install -q -c "$root/constraints.txt" "$wheel"

# From a folder outside the tree, as a user runs it: nothing can import the source folders.
cd "$work/run"
step "warmcache is the installed one"
"$bin/python" - <<'PY'
import sys
from pathlib import Path

import warmcache

where = Path(warmcache.__file__).resolve()
assert where.is_relative_to(Path(sys.prefix).resolve()), f"warmcache imported from {where}, not the venv {sys.prefix}"
print(where)
PY
step "warmcache --help, db upgrade"
"$bin/warmcache" --help >/dev/null
"$bin/warmcache" db upgrade --db "sqlite:///$work/run/registry.sqlite"
"$bin/warmcache" db current --db "sqlite:///$work/run/registry.sqlite"

step "a tiny model, plan -> warmup -> verify (eager: the route through every command, not the compiler)"
"$bin/python" -m warmcache.examples.tiny_model models --arch llama
cat >manifest.toml <<'TOML'
[registry]
url = "sqlite:///registry.sqlite"

[cache]
dir = "cache"

[[model]]
name = "tiny-llama"
path = "models/tiny-llama"
dtype = "float32"
device = "cpu"
backend = "eager"

[[model.generate]]
batch_sizes = [1]
prompt_lengths = [8]
max_cache_len = 16
TOML
"$bin/warmcache" plan manifest.toml
"$bin/warmcache" warmup manifest.toml
"$bin/warmcache" verify manifest.toml

step "the sdist installs too, over it, and answers"
pip_quietly install -q --no-deps --force-reinstall "$sdist"
"$bin/warmcache" --help >/dev/null
"$bin/warmcache" db upgrade --db "sqlite:///$work/run/sdist.sqlite"
step "wheel check passed: $(basename "$wheel"), $(basename "$sdist")"
