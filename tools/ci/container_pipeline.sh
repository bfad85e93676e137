#!/usr/bin/env bash
# The Kubernetes example's deployment path end to end with podman, on a tiny model and the AOTInductor route:
#
#   base image      a Debian bookworm rootfs from mmdebstrap, imported once and kept by tag ($BASE_IMAGE)
#   image           examples/k8s/Dockerfile --target cpu from that base, tagged localhost/warmcache:cpu
#   warmup          a container: warmcache db upgrade + warmup against PostgreSQL on the host, then
#                   warmcache push --sign to a local OCI registry (Debian's docker-registry)
#   serving         a container from the same image, as its own non-root user, --read-only, the tag mounted
#                   as an image volume at /cache (podman's --mount type=image, what a Kubernetes image volume
#                   is), key and model read-only, no tmpfs: primes every bucket from the signed packages (each
#                   .so mapped from the mount), answers ragged requests, refuses a shape no bucket serves (422),
#                   compiles nothing, imports no compiler and writes nothing
#   refusals        the same serving container stops before serving, one line in its log, on a tag signed by
#                   another key, a tag compiled under another Inductor setting, a tag with an altered package
#                   and a tag with an altered .so
#
# Exits 0 only if all of that holds; prints each phase's wall time. Needs root (rootful podman), podman with
# runc, mmdebstrap (only while the base is missing), docker-registry, skopeo, psql, curl, and the
# repository's .venv (tiny model, keys). Environment: PIP_FIND_LINKS (a folder holding torch's CPU wheel,
# used instead of PyTorch's index) and PIP_CERT (a CA bundle mounted over the image's while it builds);
# WARMCACHE_PIPELINE_POSTGRES (default postgresql://postgres@127.0.0.1:5432); BASE_IMAGE.
#
#   tools/ci/container_pipeline.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

BASE_IMAGE=${BASE_IMAGE:-localhost/warmcache-base:bookworm}
IMAGE=localhost/warmcache:cpu
POSTGRES=${WARMCACHE_PIPELINE_POSTGRES:-postgresql://postgres@127.0.0.1:5432}
PYTHON=.venv/bin/python
MODEL=m
REPOSITORY=warmcache/tiny-llama
# The buckets the warmup compiles (AOTInductor packages) and the requests the serving container answers.
BATCHES="[1, 4]"
PROMPT=8
MAX_CACHE_LEN=16

work=$(mktemp -d /tmp/warmcache-pipeline.XXXXXX)
chmod 755 "$work"
run_id=$(basename "$work" | tr -dc 'a-zA-Z0-9' | tr 'A-Z' 'a-z')
databases=()
containers=()
registry_pid=""

# Podman in this sandbox: runc (crun refuses its cgroup layout), cgroupfs, and no default ulimits to set.
export CONTAINERS_CONF="$work/containers.conf"
cat >"$CONTAINERS_CONF" <<'EOF'
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
EOF

cleanup() {
  local c
  for c in "${containers[@]}"; do podman rm -f "$c" >/dev/null 2>&1 || true; done
  podman images --format '{{.Repository}}:{{.Tag}}' | grep "/$REPOSITORY:$run_id-" | xargs -r podman rmi -f >/dev/null 2>&1 || true
  [ -n "$registry_pid" ] && kill "$registry_pid" 2>/dev/null || true
  for d in "${databases[@]}"; do psql -q "$POSTGRES/postgres" -c "DROP DATABASE IF EXISTS $d" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT

failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
phases=()
phase_start=$SECONDS
phase() { # close the running phase under name $1
  phases+=("$(printf '%-44s %5d s' "$1" $((SECONDS - phase_start)))")
  phase_start=$SECONDS
}

# --- the base image: once per machine, kept by tag ---
if podman image exists "$BASE_IMAGE"; then
  echo "base image $BASE_IMAGE: cached"
else
  echo "base image $BASE_IMAGE: building with mmdebstrap"
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates,g++ \
    --aptopt='Acquire::Check-Valid-Until "false"' bookworm "$work/base.tar" \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main"
  podman import --quiet "$work/base.tar" "$BASE_IMAGE" >/dev/null
  rm -f "$work/base.tar"
fi
phase "base image"

# --- the image (podman's layer cache rebuilds only what changed) ---
build_args=(--build-arg "BASE=$BASE_IMAGE")
if [ -n "${PIP_FIND_LINKS:-}" ]; then # torch's CPU wheel from a folder, no PyTorch index
  build_args+=(-v "$PIP_FIND_LINKS:/wheels:ro" --build-arg PIP_FIND_LINKS=/wheels --build-arg PIP_EXTRA_INDEX_URL=)
fi
if [ -n "${PIP_CERT:-}" ]; then
  build_args+=(-v "$PIP_CERT:/etc/ssl/certs/ca-certificates.crt:ro")
fi
podman build --quiet --network host --target cpu -f examples/k8s/Dockerfile "${build_args[@]}" -t "$IMAGE" . >/dev/null
[ "$(podman image inspect --format '{{.Config.User}}' "$IMAGE")" = 1000 ] && pass "$IMAGE runs as uid 1000" \
  || fail "$IMAGE does not run as uid 1000"
phase "image $IMAGE"

# --- host side: the model, the keys, the registry, the databases ---
"$PYTHON" -m warmcache.examples.tiny_model "$work/models" --arch llama >/dev/null
chmod -R a+rX "$work/models" # safetensors writes 0600; the containers read as uid 1000
mkdir -p "$work/keys"
for key in build-key other-key; do .venv/bin/warmcache keys generate "$work/keys/$key" >/dev/null; done
chown 1000:1000 "$work/keys/build-key" # the warmup container's user reads it; warmcache wants it private
port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
registry="127.0.0.1:$port"
cat >"$work/registry.yml" <<EOF
version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $work/registry
http:
  addr: $registry
EOF
docker-registry serve "$work/registry.yml" >/dev/null 2>&1 &
registry_pid=$!
for _ in $(seq 1 100); do curl -fs "http://$registry/v2/" >/dev/null && break || sleep 0.1; done
phase "model, keys, registry"

# One warmup container: schema, warmup, signed push of the compiled packages to $REPOSITORY:TAG.
warm() { # TAG BATCHES PACKAGE_PREFILL [podman options...]
  local tag=$1 batches=$2 package_prefill=$3 db="warmcache_$run_id${#databases[@]}"
  shift 3
  psql -q "$POSTGRES/postgres" -c "CREATE DATABASE $db" >/dev/null
  databases+=("$db")
  cat >"$work/$tag.toml" <<EOF
[[model]]
name = "$MODEL"
path = "/models/tiny-llama"
device = "cpu"
backend = "inductor"
precompile = "aotinductor"
package_prefill = $package_prefill

[[model.generate]]
batch_sizes = $batches
prompt_lengths = [$PROMPT]
max_cache_len = $MAX_CACHE_LEN
EOF
  podman run --rm --network host "$@" \
    -e "WARMCACHE_DB=$POSTGRES/$db" \
    -v "$work/$tag.toml:/etc/warmcache/deploy.toml:ro" \
    -v "$work/keys/build-key:/etc/warmcache/signing/build-key:ro" \
    -v "$work/models:/models:ro" \
    "$IMAGE" sh -c "warmcache db upgrade >/dev/null && warmcache warmup /etc/warmcache/deploy.toml --cache-dir /tmp/cache \
      && warmcache push /etc/warmcache/deploy.toml --cache-dir /tmp/cache --sign /etc/warmcache/signing/build-key \
         --store oci+http://$registry/$REPOSITORY:$tag"
  podman pull --quiet --tls-verify=false "$registry/$REPOSITORY:$tag" >/dev/null
}

good="$run_id-good"
warm "$good" "$BATCHES" true
phase "warmup container + signed push ($BATCHES)"

# Another toolchain, honestly: the same model compiled with another C++ codegen setting of Inductor (horizontal
# fusion capped at one kernel), which the toolchain fingerprint records; signed by the right key.
# (TORCHINDUCTOR_FREEZING=1 would be the classic one, but it folds the weights into the package.) Its decode package
# alone: the serving container refuses its rows as stale before it asks for a prefill (a second Inductor compile).
other_setting=TORCHINDUCTOR_CPP_MAX_HORIZONTAL_FUSION_SIZE=1
other_toolchain="$run_id-other-setting"
warm "$other_toolchain" "[1]" false -e "$other_setting"
phase "warmup container, another Inductor setting"

# An altered layer, pushed by someone without the key: every digest consistent, one byte flipped in a package, and
# in another tag in a package's unpacked .so (aotinductor-lib/), which the serving container maps where it lies.
tamper() { # TAG FOLDER
  skopeo copy --quiet --src-tls-verify=false "docker://$registry/$REPOSITORY:$good" "oci:$work/layout-$1:$good"
  "$PYTHON" tools/ci/oci_tamper.py "$work/layout-$1" "$good" "$2"
  skopeo copy --quiet --dest-tls-verify=false "oci:$work/layout-$1:$good" "docker://$registry/$REPOSITORY:$1"
  podman pull --quiet --tls-verify=false "$registry/$REPOSITORY:$1" >/dev/null
}
tampered="$run_id-tampered"
tamper "$tampered" aotinductor/
tampered_library="$run_id-tampered-library"
tamper "$tampered_library" aotinductor-lib/
phase "tampered tags"

# The serving container as the Deployment runs it: the image's own user, the tag as an image volume, and nothing
# writable: --read-only with no tmpfs, so /tmp is the image's own, read-only (each package's .so is dlopen-ed from
# the mount where it lies, see warmcache/runtime/mapped_library.py); /dev/shm is checked empty after serving.
serve_args() { # TAG KEY
  echo --read-only --read-only-tmpfs=false --network host \
    --mount "type=image,source=$registry/$REPOSITORY:$1,destination=/cache" \
    -v "$work/keys/$2.pub:/etc/warmcache/trust/$2.pub:ro" -v "$work/models:/models:ro" "$IMAGE" \
    python /app/serve.py /cache "$MODEL" "/etc/warmcache/trust/$2.pub" --model-path /models/tiny-llama
}

serve_port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
serving="warmcache-serve-$run_id"
containers+=("$serving")
# shellcheck disable=SC2046
podman run -d --name "$serving" $(serve_args "$good" build-key) --port "$serve_port" >/dev/null
for _ in $(seq 1 600); do
  curl -fs "http://127.0.0.1:$serve_port/readyz" >/dev/null && break
  [ "$(podman inspect --format '{{.State.Running}}' "$serving")" = true ] || break
  sleep 0.1
done
phase "serving container start to /readyz (every bucket primed)"
log=$(podman logs "$serving" 2>&1)
echo "serving log: $log"
grep -q "^primed 2 buckets (2 precompiled) from /cache" <<<"$log" && pass "primed both buckets from the packages" \
  || fail "the serving container did not prime both packages"

request() { # EXPECTED_STATUS JSON_BODY
  local status
  status=$(curl -s -o "$work/answer.json" -w '%{http_code}' -H 'Content-Type: application/json' \
    --data "$2" "http://127.0.0.1:$serve_port/generate")
  [ "$status" = "$1" ] && pass "POST /generate $2 -> $status" || fail "POST /generate $2 -> $status, not $1: $(cat "$work/answer.json")"
}
request 200 '{"input_ids": [[5, 6, 7, 8, 9]], "max_new_tokens": 4}'
request 200 '{"input_ids": [[11, 12, 13], [14, 15, 16], [17, 18, 19]], "max_new_tokens": 6}'
request 200 '{"input_ids": [[20, 21, 22, 23, 24, 25, 26, 27], [28, 29, 30, 31, 32, 33, 34, 35]], "max_new_tokens": 8}'
request 200 '{"input_ids": [[5, 6], [7, 8], [9, 10], [11, 12]], "max_new_tokens": 2}'
request 422 '{"input_ids": [[1], [2], [3], [4], [5]], "max_new_tokens": 2}'
request 422 '{"input_ids": [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]], "max_new_tokens": 2}'
stats=$(curl -fs "http://127.0.0.1:$serve_port/stats")
[ "$stats" = '{"graphs": 0, "frames": 0, "compiler_modules": []}' ] \
  && pass "0 graphs compiled, 0 frames traced, no compiler module imported" || fail "compiled or imported a compiler: $stats"
[ "$(podman exec "$serving" id -u)" = 1000 ] && pass "serving as uid 1000" || fail "serving as root"
written=$(podman exec "$serving" find /tmp /dev/shm -mindepth 1)
if [ -z "$written" ] && ! podman exec "$serving" touch /home/warmcache/probe 2>/dev/null \
  && ! podman exec "$serving" touch /tmp/probe 2>/dev/null && ! podman exec "$serving" touch /cache/probe 2>/dev/null; then
  pass "nothing written, nothing writable (root, /tmp and /cache read-only; /dev/shm empty)"
else
  fail "written to /tmp or /dev/shm ($written), or the root, /tmp or /cache is writable"
fi
# An image volume's files show in /proc/PID/maps by their path inside the image (/aotinductor-lib/…, no /cache).
maps=$(podman exec "$serving" cat /proc/1/maps)
if grep -q '/aotinductor-lib/' <<<"$maps" && ! grep -q 'warmcache-aoti-\|aotinductor_' <<<"$maps"; then
  pass "each package's .so mapped from the mount where it lies, none unpacked"
else
  fail "a package's .so not mapped from the mount's aotinductor-lib/, or one unpacked"
fi
podman rm -f "$serving" >/dev/null
phase "requests"

# Each refusal: a non-zero exit before serving, one line in the log naming why.
refused() { # WHAT TAG KEY EXPECTED
  local out rc=0
  # shellcheck disable=SC2046
  out=$(podman run --rm $(serve_args "$2" "$3") --port "$serve_port" 2>&1) || rc=$?
  if [ "$rc" -ne 0 ] && [ "$(wc -l <<<"$out")" -eq 1 ] && grep -q -- "$4" <<<"$out"; then
    pass "$1 refused at start (exit $rc): $out"
  else
    fail "$1 not refused in one line (exit $rc): $out"
  fi
}
refused "a tag signed by another key" "$good" other-key "not trusted"
refused "a tag compiled under $other_setting" "$other_toolchain" build-key "stale"
refused "a tag with an altered layer" "$tampered" build-key "sha256"
refused "a tag with an altered .so" "$tampered_library" build-key "AOTInductor library sha256"
phase "four refusals"

echo "--- container pipeline: wall time per phase"
printf '%s\n' "${phases[@]}"
printf '%-44s %5d s\n' "total" "$SECONDS"
if [ "$failures" -ne 0 ]; then
  echo "container pipeline: $failures check(s) failed" >&2
  exit 1
fi
echo "container pipeline: every check passed"
