#!/usr/bin/env bash
# Sync vs async rollouts on recipes/grpo-async-smollm2-arith.toml: seconds per RL step, tokens
# per second and the staleness histogram for sync and for async with eta = 0, 1, 2, 4 (one
# rollout worker; the two cores split one for the worker and one for the learner), and async
# eta = 1 with both sides sharing one pool. Runs one at a time (they compete for the same cores).
#   scripts/async_throughput.sh [STEPS]        (default 12; needs ./scripts/fetch-smollm2.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-12}
bin=${CARGO_TARGET_DIR:-target}/release/examples/train
[[ -x $bin ]] || cargo build --release --example train
out=runs/async_throughput
mkdir -p "$out"
common=(--set logging.progress=false --set "schedule.steps=$steps" --set eval.every=0
  --set eval.size=8 --set eval.k=1 --set checkpoint.every=0 --set checkpoint.export_final=false)
run() {
  local name=$1; shift
  rm -rf "${out:?}/$name"
  "$bin" recipes/grpo-async-smollm2-arith.toml --set "output_dir=\"$out/$name\"" "${common[@]}" \
    "$@" > "$out/$name.log"
}
# The sync arm: the same recipe without its [async] section.
sed '/^\[async\]/,/^$/d' recipes/grpo-async-smollm2-arith.toml > "$out/sync.toml"
rm -rf "${out:?}/sync"
"$bin" "$out/sync.toml" --set "output_dir=\"$out/sync\"" "${common[@]}" > "$out/sync.log"
for eta in 0 1 2 4; do
  run "async-eta$eta" --set "async.max_staleness=$eta"
done
# Both sides on the shared pool: the recipe without its thread settings.
grep -v '_threads' recipes/grpo-async-smollm2-arith.toml > "$out/shared.toml"
rm -rf "${out:?}/async-eta1-shared"
"$bin" "$out/shared.toml" --set "output_dir=\"$out/async-eta1-shared\"" "${common[@]}" \
  > "$out/async-eta1-shared.log"
python3 - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
rows = []
for name in ["sync", "async-eta0", "async-eta1", "async-eta2", "async-eta4", "async-eta1-shared"]:
    f = out / name / "metrics.jsonl"
    if not f.exists():
        continue
    ms = [json.loads(l) for l in f.read_text().splitlines() if l.strip()]
    steps = [m for m in ms if m.get("step", 0) > 0]
    # Wall time of the RL steps: the learner's step time (waiting for batches included).
    wall = sum(m["time/step_s"] for m in steps[1:])
    toks = sum(m["response_len/mean"] * 32 for m in steps[1:])
    n = len(steps) - 1
    hist = {}
    for m in steps:
        for k, v in m.items():
            if k.startswith("staleness/hist/"):
                hist[k.split("/")[-1]] = hist.get(k.split("/")[-1], 0) + v / len(steps)
    idle = [m.get("async/learner_idle") for m in steps[1:] if "async/learner_idle" in m]
    h = " ".join(f"{k}:{v:.2f}" for k, v in hist.items() if v > 0)
    li = f"{sum(idle)/len(idle):.2f}" if idle else "-"
    print(f"| {name} | {wall/n:.2f} | {toks/wall:.1f} | {li} | {h} |")
PY
