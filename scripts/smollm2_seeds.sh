#!/usr/bin/env bash
# recipes/grpo-smollm2-arith.toml over seeds 0-4 (or the seeds given), one run at a time: keeps
# each run's metrics as docs/runs/grpo-smollm2-arith/seedN.jsonl.gz (with its wall time as
# `wall_s`) and prints the table of recipes/README.md (scripts/smollm2_seeds_table.py). With
# STEPS=N the runs take N RL steps instead of the recipe's and are kept as stepsN-seedM.jsonl.gz.
# Needs ./scripts/fetch-smollm2.sh first.
#   [STEPS=N] scripts/smollm2_seeds.sh [SEED ...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/keep_run.sh
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(0 1 2 3 4)
cargo build --release --example train -q
bin="${CARGO_TARGET_DIR:-target}/release/examples/train"
out=docs/runs/grpo-smollm2-arith
prefix=${STEPS:+steps$STEPS-}
extra=()
[ -z "${STEPS:-}" ] || extra=(--set "schedule.steps=$STEPS" --set checkpoint.every=0)
mkdir -p "$out"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for seed in "${seeds[@]}"; do
  dir="$scratch/seed$seed"
  keep_run "$dir" "$out/${prefix}seed$seed.jsonl.gz" "$dir.log" \
    "$bin" recipes/grpo-smollm2-arith.toml --set "seed=$seed" --set "output_dir=\"$dir\"" \
    --set logging.progress=false "${extra[@]}"
  echo "seed $seed done"
done
python3 scripts/smollm2_seeds_table.py "$out" ${STEPS:+--steps "$STEPS"}
