#!/usr/bin/env bash
# recipes/quickstart-moe.toml with router replay on and off, seeds 0-9 (or the seeds given):
# keeps each run's metrics as docs/runs/moe-replay/{replay,free}-seedN.jsonl.gz and prints the
# table of docs/mixture-of-experts.md (scripts/moe_replay_table.py).
#   scripts/moe_replay_runs.sh [SEED ...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/keep_run.sh
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(0 1 2 3 4 5 6 7 8 9)
cargo build --release --example train --features ndarray -q
bin="${CARGO_TARGET_DIR:-target}/release/examples/train"
out=docs/runs/moe-replay
mkdir -p "$out"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for seed in "${seeds[@]}"; do
  for mode in replay free; do
    replay=$([ "$mode" = replay ] && echo true || echo false)
    dir="$scratch/$mode-$seed"
    keep_run "$dir" "$out/$mode-seed$seed.jsonl.gz" "$dir.log" \
      "$bin" recipes/quickstart-moe.toml --set "seed=$seed" --set "output_dir=\"$dir\"" \
      --set "algorithm.router_replay=$replay" --set logging.progress=false
    echo "seed $seed $mode done"
  done
done
python3 scripts/moe_replay_table.py "$out"
