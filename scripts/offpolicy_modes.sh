#!/usr/bin/env bash
# The correction modes on the quickstart with stale samples inside each step (4 epochs x 4
# mini-batches: 16 optimiser steps per batch), seeds 0-2, the same learning rate for every mode.
# Prints one line per run: final held-out accuracy, and the last step's mismatch KL (k1 and k3)
# between mu and the policy the correction compares it with (pi_prox, pi_old or pi_theta).
#   scripts/offpolicy_modes.sh [SEEDS...]      (default: 0 1 2; two runs at a time, one thread each)
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=("${@:-0 1 2}")
read -r -a seeds <<< "${seeds[*]}"
bin=${CARGO_TARGET_DIR:-target}/release/examples/train
[[ -x $bin ]] || cargo build --release --example train
out=runs/offpolicy_modes
mkdir -p "$out"
declare -A extra=(
  [auto]=''
  [recompute]=''
  [decoupled]='--set algorithm.correction.is_level="token" --set algorithm.correction.is_threshold=2.0'
  [bypass]='--set algorithm.correction.is_level="token" --set algorithm.correction.is_threshold=2.0'
)
jobs=()
for seed in "${seeds[@]}"; do
  for mode in auto recompute decoupled bypass; do
    jobs+=("$seed $mode")
  done
done
run() {
  local seed=$1 mode=$2 dir=$out/$mode-seed$1
  rm -rf "$dir"
  # shellcheck disable=SC2086
  RAYON_NUM_THREADS=1 "$bin" recipes/quickstart.toml --set seed="$seed" \
    --set output_dir="\"$dir\"" --set logging.progress=false \
    --set algorithm.ppo_epochs=4 --set algorithm.mini_batches=4 --set optimizer.lr=1e-4 \
    --set algorithm.correction.mode="\"$mode\"" ${extra[$mode]} > "$dir.log" 2>&1
}
export -f run
export out bin
for j in "${jobs[@]}"; do
  read -r seed mode <<< "$j"
  run "$seed" "$mode" &
  while (( $(jobs -rp | wc -l) >= 2 )); do sleep 1; done
done
wait
python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print(f"{'run':<22} {'held-out start':>14} {'held-out end':>12} {'offpolicy/kl':>13} {'offpolicy/k3_kl':>15}")
for d in sorted(p for p in out.iterdir() if p.is_dir()):
    rows = [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines() if l.strip()]
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    steps = [r for r in rows if "offpolicy/kl" in r]
    kl = steps[-1]["offpolicy/kl"] if steps else float("nan")
    k3 = steps[-1]["offpolicy/k3_kl"] if steps else float("nan")
    print(f"{d.name:<22} {evals[0]:>14.2f} {evals[-1]:>12.2f} {kl:>13.3e} {k3:>15.3e}")
PY
