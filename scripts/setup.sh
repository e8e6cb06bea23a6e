#!/usr/bin/env bash
# Sets a fresh Debian/Ubuntu machine up for Escala: installs every dependency by package name,
# builds the project (Release) into build/, and runs the main job.
#
#   scripts/setup.sh              install, build, run the main job
#   scripts/setup.sh --deps-only  install only (what .ci/run uses before scripts/test.sh)
#
# Nothing is downloaded except Debian packages through apt-get; no code is vendored. clang is for
# the libFuzzer target (tests/fuzz). Python needs no packages from pip yet.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

deps_only=0
for arg in "$@"; do
  case "$arg" in
    --deps-only) deps_only=1 ;;
    -h | --help)
      sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "setup.sh: unknown argument '$arg' (try --help)" >&2
      exit 2
      ;;
  esac
done

PACKAGES=(
  build-essential cmake pkg-config clang
  libhwy-dev libcli11-dev nlohmann-json3-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcpp-httplib-dev libopenblas-dev
  python3 python3-pip
)

# Install only what is missing, so that a machine that is already set up (or offline) is fine.
missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
if ((${#missing[@]})); then
  SUDO=()
  if [ "$(id -u)" -ne 0 ]; then SUDO=(sudo); fi
  echo "setup.sh: installing ${missing[*]}"
  "${SUDO[@]}" apt-get update
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
else
  echo "setup.sh: all ${#PACKAGES[@]} packages already installed"
fi
if ((deps_only)); then exit 0; fi

# Same configuration as scripts/test.sh, so that the two commands share one build.
JOBS="${ESCALA_JOBS:-$(nproc)}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DESCALA_WERROR=ON
cmake --build build -j "$JOBS"

# The main job: the KV-cache plan of a real model, then the CPU attention benchmark.
echo
echo "== escala kv-plan --preset llama-3-8b --context 8192"
build/escala kv-plan --preset llama-3-8b --context 8192
echo
echo "== escala bench attention --quick"
build/escala bench attention --quick
