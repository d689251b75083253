#!/usr/bin/env bash
# The learner against PyTorch on the same machine, in the same run: PAIRS alternating pairs of
#   throughput --model GGUF --train --json          (rlft, release build)
#   python3 scripts/bench_hf.py --only train --model HF_DIR   (PyTorch/transformers)
# on the same f32 weights, then the median over the pairs of each figure and of each ratio
# rlft / PyTorch for forward_tok_s, fwd_bwd_tok_s and fwd_bwd_adamw_tok_s.
#
#   scripts/learner_ratios.sh [GGUF] [HF_DIR] [PAIRS]
#     GGUF: models/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch-smollm2.sh)
#     HF_DIR: build/smollm2-hf, written from GGUF with `rlft export GGUF --hf HF_DIR` if missing
#     PAIRS: 3; PYTHON (python3) must have torch and transformers; REPS (3) steps per figure
set -euo pipefail
cd "$(dirname "$0")/.."
gguf=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
hf=${2:-build/smollm2-hf}
pairs=${3:-3}
py=${PYTHON:-python3}
cargo build --release --example throughput --bin rlft --features ndarray -q
target=${CARGO_TARGET_DIR:-target}/release
[[ -d $hf ]] || "$target/rlft" export "$gguf" --hf "$hf"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq 1 "$pairs"); do
  "$target/examples/throughput" --model "$gguf" --train --json --reps "${REPS:-3}" | tail -n 1 > "$out/rlft-$i.json"
  "$py" scripts/bench_hf.py --only train --model "$hf" --reps "${REPS:-3}" | tail -n 1 > "$out/torch-$i.json"
done
python3 - "$out" "$pairs" <<'PY'
import json, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
keys = ["forward_tok_s", "fwd_bwd_tok_s", "fwd_bwd_adamw_tok_s"]
rows = [(json.load(open(f"{out}/rlft-{i}.json")), json.load(open(f"{out}/torch-{i}.json")))
        for i in range(1, pairs + 1)]
summary = {}
for k in keys:
    r = [a[k] for a, _ in rows]
    t = [b[k] for _, b in rows]
    ratio = [a / b for a, b in zip(r, t)]
    summary[k] = {"rlft": statistics.median(r), "pytorch": statistics.median(t),
                  "ratio": round(statistics.median(ratio), 3),
                  "ratios": [round(x, 3) for x in ratio]}
    print(f"{k:22} rlft {summary[k]['rlft']:>9.1f}  pytorch {summary[k]['pytorch']:>9.1f}  "
          f"ratio {summary[k]['ratio']:.3f}  (pairs: {summary[k]['ratios']})")
print(json.dumps(summary))
PY
