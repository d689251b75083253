#!/usr/bin/env bash
# Decode and GRPO-step speed of SmolLM2-135M's architecture (random weights) in f32 and bf16 on
# one GPU, from a binary built beforehand: the GPU machine needs neither network nor toolchain.
#
# Build it on a machine with network (cubecl-cuda's build script downloads its LLVM):
#   cargo build --release --features cuda --example gpu_bench
# copy target/release/examples/gpu_bench over, then run
#   scripts/gpu-bench.sh [BINARY] [DEVICE]
# BINARY defaults to target/release/examples/gpu_bench, DEVICE to cuda. Environment:
#   HBM_GBS   the GPU's memory bandwidth in GB/s, for the HBM fraction (default 4800, an H200)
#   SIZE      smollm2-135m (default) or tiny (a check on a CPU: DEVICE=flex)
#   BATCH, NEW_TOKENS, STEPS   (defaults 8, 128, 5)
# Each dtype gets at most 4 minutes, so the whole script ends within 10. Prints one JSON line
# per dtype, then a Markdown table for README.
set -euo pipefail

bin="${1:-target/release/examples/gpu_bench}"
device="${2:-cuda}"
size="${SIZE:-smollm2-135m}"
if [ ! -x "$bin" ]; then
  echo "no executable at $bin: build it with cargo build --release --features cuda --example gpu_bench" >&2
  exit 2
fi

field() { # field NAME JSON -> the number
  printf '%s' "$2" | grep -o "\"$1\":[-0-9.eE+]*" | head -n 1 | cut -d: -f2
}

rows=()
for dtype in f32 bf16; do
  if ! line=$(timeout 240 "$bin" --device "$device" --dtype "$dtype" --size "$size" \
    --batch "${BATCH:-8}" --new-tokens "${NEW_TOKENS:-128}" --steps "${STEPS:-5}" \
    --hbm-gbs "${HBM_GBS:-4800}" --json); then
    echo "$dtype: failed or timed out" >&2
    continue
  fi
  echo "$line"
  b=${BATCH:-8}
  rows+=("| $dtype | $(printf '%.0f' "$(field decode_tok_s_b1 "$line")") | $(printf '%.0f' "$(field "decode_tok_s_b$b" "$line")") | $(printf '%.3g' "$(field hbm_fraction_b1 "$line")") | $(printf '%.0f' "$(field train_tok_s "$line")") | $(printf '%.2f' "$(field step_s "$line")") |")
done

echo
echo "$(date +%F) · $size · device $device · batch ${BATCH:-8} · ${NEW_TOKENS:-128} new tokens"
echo "| dtype | decode tok/s (b1) | decode tok/s (b${BATCH:-8}) | HBM fraction (b1) | train tok/s | GRPO step s |"
echo "|---|---|---|---|---|---|"
for r in "${rows[@]}"; do echo "$r"; done
