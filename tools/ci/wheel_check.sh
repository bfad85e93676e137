#!/usr/bin/env bash
# What users install, proven the way they install it: the sdist and the wheel built from a clean copy of the tree,
# the wheel installed (not editable, with the quickstart's `serve` extra) with constraints.txt into a fresh venv, and
# from there, in an empty folder outside the tree, the commands a user runs first: `warmcache --help`, `db upgrade`,
# and the README's quickstart, its own command line with only its install step replaced by the wheel's (the folder
# holds the two example files it names, examples/tiny-cpu.toml and examples/guard_request.py, and no source). Then the
# sdist installs over it and answers too. An editable checkout imports folders the wheel may lack (warmcache.store.oci
# once was; the quickstart's model builder was tools/tiny_model.py), so only this catches what the wheel drops.
#
#     tools/ci/wheel_check.sh [WORKDIR]     # WORKDIR (kept, reused by a rerun) holds the copy, dist/ and the run
#
# The venv is always new (never --system-site-packages): pip's cache and the local torch wheel ($PIP_FIND_LINKS)
# make it quick. BUILD_PYTHON is an interpreter with the `build` package (default: a venv of its own in WORKDIR with
# `build` alone, so the script needs no .venv: CI starts it while the test command is still installing .venv).
# The quickstart compiles for real: 68 s on a quiet 2-core AMD EPYC with AVX-512 (warmup 35 s, verify 17 s), where
# the same line took about 10 minutes on a 2-core AVX2 EPYC shared with other jobs.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ -n "${1:-}" ]; then
  work=$(mkdir -p "$1" && cd "$1" && pwd)
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
builder=${BUILD_PYTHON:-}
started=$SECONDS
step() { echo "--- $* (at $((SECONDS - started)) s)"; }
# pip warns about each find-links folder it skips: its output shows only when it fails.
pip_quietly() { "$bin/pip" "$@" >"$work/pip.log" 2>&1 || { tail -30 "$work/pip.log"; exit 1; }; }

step "a clean copy of the tree: tracked and new files, no build/, *.egg-info or .venv"
rm -rf "$work/src" "$work/dist" "$work/run" "$work/upgrade.sqlite"
mkdir -p "$work/src" "$work/run"
(
  cd "$root"
  git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' file; do
    [ -f "$file" ] && printf '%s\0' "$file"  # a tracked file deleted in the working tree is not part of it
  done | tar --null -T - -cf -
) | tar -xf - -C "$work/src"

step "the sdist, and the wheel built from it (so the sdist holds all the wheel needs)"
if [ -z "$builder" ]; then
  [ -x "$work/builder/bin/python" ] || python3 -m venv "$work/builder"
  "$work/builder/bin/pip" install -q -c "$root/constraints.txt" build >"$work/builder.log" 2>&1 \
    || { tail -30 "$work/builder.log"; exit 1; }
  builder=$work/builder/bin/python
fi
"$builder" -m build --outdir "$work/dist" "$work/src" >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
sdist=$(echo "$work"/dist/warmcache-*.tar.gz)
wheel=$(echo "$work"/dist/warmcache-*.whl)
[ -f "$sdist" ] && [ -f "$wheel" ] || { echo "wheel_check: no sdist or wheel in $work/dist" >&2; exit 1; }

# The README's quickstart line, its install step (which installs the checkout) cut off: what follows it runs as written.
INSTALL="python3 -m venv .venv && .venv/bin/pip install -q -c constraints.txt '.[serve]' && "
quickstart=$(INSTALL=$INSTALL python3 - "$root/README.md" <<'PY'
import os, re, sys
text = open(sys.argv[1], encoding="utf-8").read()
block = re.search(r"```bash\n(.*?)\n```", text.split("\n## Quickstart", 1)[1], re.DOTALL).group(1).strip()
if not block.startswith(os.environ["INSTALL"]):
    sys.exit(f"wheel_check: the README's quickstart no longer begins with {os.environ['INSTALL']!r}: update this script")
print(block[len(os.environ["INSTALL"]):])
PY
)

step "an empty folder outside the tree: a fresh .venv with the wheel, its serve extra and constraints.txt"
run=$work/run
python3 -m venv "$run/.venv"
bin=$run/.venv/bin
pip_quietly install -q -c "$root/constraints.txt" "$wheel[serve]"

# From the folder outside the tree, as a user runs it: nothing can import the source folders.
cd "$run"
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
"$bin/warmcache" db upgrade --db "sqlite:///$work/upgrade.sqlite"
"$bin/warmcache" db current --db "sqlite:///$work/upgrade.sqlite"

mkdir examples
cp "$work/src/examples/tiny-cpu.toml" "$work/src/examples/guard_request.py" examples/
step "the README's quickstart, from the wheel: $(echo "$quickstart" | cut -c1-80)..."
# Its server is stopped by its last step; stopped here too when an earlier step fails.
bash -c "$quickstart"'
status=$?; [ -n "${SERVE:-}" ] && kill "$SERVE" 2>/dev/null; exit $status'

step "the sdist installs too, over it, and answers"
pip_quietly install -q --no-deps --force-reinstall "$sdist"
"$bin/warmcache" --help >/dev/null
"$bin/warmcache" db upgrade --db "sqlite:///$work/sdist.sqlite"
step "wheel check passed: $(basename "$wheel"), $(basename "$sdist")"
