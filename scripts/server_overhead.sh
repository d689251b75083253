#!/usr/bin/env bash
# What sampling on inference servers costs: a recipe run in-process, on `rollout.servers =
# "local:N"`, and on one and two `rlft serve` processes given by URL, in sync mode and async
# η = 2, with the seconds per step, the learner's and the rollout side's idle fractions, and
# the weight publish (write to weights_dir + the servers' reload). Prints one Markdown row per
# run; the runs stay in runs/server_overhead/<recipe> (for examples/async_sim.rs).
#
#   scripts/server_overhead.sh RECIPE STEPS [--set KEY=VALUE]...
#
# The `rlft serve` processes serve the in-process run's final weights (the architecture the run
# pushes to them). Run from the repository root; builds the release binary first.
set -euo pipefail
cd "$(dirname "$0")/.."
recipe=${1:?usage: scripts/server_overhead.sh RECIPE STEPS [--set KEY=VALUE]...}
steps=${2:?usage: scripts/server_overhead.sh RECIPE STEPS [--set KEY=VALUE]...}
shift 2
target=${CARGO_TARGET_DIR:-$HOME/.cache/rlft-target}
cargo build --release --bin rlft -q
rlft="$target/release/rlft"
work=runs/server_overhead/$(basename "$recipe" .toml)
rm -rf "$work"
mkdir -p "$work"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
sets=(--set logging.progress=false --set "schedule.steps=$steps" --set eval.every=0
      --set checkpoint.every=0)
for a in "$@"; do sets+=("$a"); done

run() { # name, extra --set arguments...
  local name=$1; shift
  "$rlft" train "$recipe" --set "output_dir=\"$work/$name\"" "${sets[@]}" "$@" >/dev/null
  python3 - "$work/$name" "$name" <<'EOF'
import json, sys
run, name = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
rows = [r for r in rows if "time/step_s" in r]  # RL steps (not the step-0 evaluation)
rows = rows[1:] or rows                        # the first step includes the servers' start
mean = lambda k: sum(r.get(k, 0.0) for r in rows) / len(rows)
print(f"| {name} | {60 / mean('time/step_s'):.2f} | {mean('time/step_s'):.2f} | "
      f"{mean('time/generate_s'):.2f} | {mean('async/learner_idle'):.2f} | "
      f"{mean('async/rollout_idle'):.2f} | {mean('server/weight_write_s'):.3f} | "
      f"{mean('server/weight_load_s'):.3f} | {mean('server/request_s'):.2f} |")
EOF
}

serve() { # starts an `rlft serve` on the in-process run's weights; sets $url
  local out=$work/serve-$RANDOM
  "$rlft" serve "$work/in-process" --port 0 >"$out.out" 2>"$out.err" &
  pids+=($!)
  for _ in $(seq 600); do grep -q "http://" "$out.out" 2>/dev/null && break; sleep 0.1; done
  url=$(head -n 1 "$out.out" | sed 's/.* on //')
}

echo "| run | steps/min | s/step | generate s | learner idle | rollout idle | weight write s | weight load s | request s |"
echo "|---|---|---|---|---|---|---|---|---|"
run in-process
run local-1 --set 'rollout.servers="local:1"'
serve; one=$url
serve; two=$url
run serve-1 --set "rollout.servers=[\"$one\"]"
run serve-2 --set "rollout.servers=[\"$one\", \"$two\"]"
async=(--set 'async.mode="async"' --set async.max_staleness=2)
run async-in-process "${async[@]}"
run async-local-1 "${async[@]}" --set 'rollout.servers="local:1"'
run async-serve-1 "${async[@]}" --set "rollout.servers=[\"$one\"]"
run async-serve-2 "${async[@]}" --set async.rollout_workers=2 \
  --set "rollout.servers=[\"$one\", \"$two\"]"
