#!/usr/bin/env bash
# The staleness experiment: the lagged testbed (every step samples with the policy `lag`
# versions old) on a recipe, one run per correction arm, lag and seed. Prints one line per run:
# held-out accuracy at step 0 and at the end, and the last step's mismatch KL between mu and the
# policy the arm compares it with (offpolicy/kl, k1).
# Metrics files go to docs/runs/staleness/<recipe>-<arm>-lag<k>-seed<s>.jsonl.gz;
# scripts/staleness_table.py prints the table from them.
#   scripts/staleness_experiment.sh [RECIPE] [LAGS] [SEEDS] [ARMS]
#     default: recipes/quickstart.toml "0 2 4 8" "0 1 2" and every arm below; JOBS (default 2)
#     runs at a time, one thread each; EXTRA adds --set options to every run
set -euo pipefail
cd "$(dirname "$0")/.."
recipe=${1:-recipes/quickstart.toml}
read -r -a lags <<< "${2:-0 2 4 8}"
read -r -a seeds <<< "${3:-0 1 2}"
all_arms="none recompute decoupled-tis decoupled-icepop ctpo-mu decoupled-m2po opsm-trl vespo \
decoupled-tis-loglinear none-topp replay-topp replay-topp-penalty"
read -r -a arms <<< "${4:-$all_arms}"
bin=${CARGO_TARGET_DIR:-target}/release/examples/train
[[ -x $bin ]] || cargo build --release --example train
name=$(basename "$recipe" .toml)
out=runs/staleness/$name
docs=docs/runs/staleness
mkdir -p "$out" "$docs"
declare -A arm=(
  # bypass without IS: the PPO ratio is taken against mu
  [none]='--set algorithm.correction.mode="bypass"'
  # the learner recomputes pi_old (pi_prox) and anchors the ratio there; mu is ignored
  [recompute]='--set algorithm.correction.mode="recompute"'
  # decoupled PPO: ratio against pi_prox, token IS weights pi_prox/mu truncated at 2
  [decoupled-tis]='--set algorithm.correction.mode="decoupled" --set algorithm.correction.is_level="token" --set algorithm.correction.is_threshold=2.0'
  # decoupled PPO with IcePop: token weights outside [0.5, 5] are zeroed
  [decoupled-icepop]='--set algorithm.correction.mode="decoupled" --set algorithm.correction.is_level="token" --set algorithm.correction.is_threshold="0.5_5.0"'
  # CTPO's cumulative ratio, taken against the behaviour policy mu
  [ctpo-mu]='--set algorithm.loss="ctpo" --set algorithm.correction.mode="recompute" --set algorithm.ratio_reference="behaviour"'
  # AReaL's M2PO: decoupled-tis, and over the step's tokens the largest (log mu - log pi_prox)^2
  # masked until the rest's mean is below 0.04 (AReaL's default)
  [decoupled-m2po]='--set algorithm.correction.mode="decoupled" --set algorithm.correction.is_level="token" --set algorithm.correction.is_threshold=2.0 --set algorithm.correction.m2po_threshold=0.04'
  # TRL's off-policy sequence masking on `none`: negative-advantage rows whose mean
  # log(mu/pi) exceeds 0.5 get no loss
  [opsm-trl]='--set algorithm.correction.mode="bypass" --set algorithm.correction.opsm="trl" --set algorithm.correction.opsm_delta=0.5'
  # TRL's VESPO loss (gamma-weighted REINFORCE on the ratio against mu)
  [vespo]='--set algorithm.loss="vespo" --set algorithm.correction.mode="bypass"'
  # decoupled-tis with AReaL's log-linear pi_prox (no pi_prox pass)
  [decoupled-tis-loglinear]='--set algorithm.correction.mode="decoupled" --set algorithm.correction.is_level="token" --set algorithm.correction.is_threshold=2.0 --set algorithm.correction.prox="loglinear"'
  # `none` on a top-p 0.8 sampler: the control of replay-topp
  [none-topp]='--set algorithm.correction.mode="bypass" --set rollout.top_p=0.8'
  # the same sampler with sampling-mask replay: the learner's log-probs over the kept sets
  [replay-topp]='--set algorithm.correction.mode="bypass" --set rollout.top_p=0.8 --set algorithm.sampling_mask="replay"'
  # replay-topp with a penalty on the policy's mass outside the replayed kept sets
  [replay-topp-penalty]='--set algorithm.correction.mode="bypass" --set rollout.top_p=0.8 --set algorithm.sampling_mask="replay" --set algorithm.outside_mass_coef=1.0'
)
jobs=()
# Seed by seed, so an interrupted sweep has whole seeds.
for seed in "${seeds[@]}"; do
  for lag in "${lags[@]}"; do
    for a in "${arms[@]}"; do
      [[ -n ${arm[$a]+x} ]] || { echo "unknown arm $a; arms: $all_arms" >&2; exit 2; }
      jobs+=("$a $lag $seed")
    done
  done
done
summary() {
  python3 - "$1" "$2" <<'PY'
import gzip, json, sys
ms = [json.loads(l) for l in gzip.open(sys.argv[1], "rt") if l.strip()]
ev = [m["eval/accuracy"] for m in ms if "eval/accuracy" in m]
last = ms[-1]
kl = last.get("offpolicy/kl")
print(f"{sys.argv[2]}: {ev[0]:.2f} -> {ev[-1]:.2f}  offpolicy/kl {kl if kl is None else f'{kl:.3g}'}  staleness/max {last.get('staleness/max')}")
PY
}
run() {
  local a=$1 lag=$2 seed=$3 tag=$1-lag$2-seed$3
  # A run whose metrics are already in docs/ is reported, not repeated (RERUN=1 repeats it).
  if [[ -z ${RERUN:-} && -f $docs/$name-$tag.jsonl.gz ]]; then
    summary "$docs/$name-$tag.jsonl.gz" "$tag"
    return
  fi
  rm -rf "${out:?}/$tag"
  # shellcheck disable=SC2086
  RAYON_NUM_THREADS=1 "$bin" "$recipe" --set "output_dir=\"$out/$tag\"" --set "seed=$seed" \
    --set logging.progress=false --set checkpoint.export_final=false \
    --set 'async.mode="lagged"' --set "async.lag=$lag" ${arm[$a]} ${EXTRA:-} > "$out/$tag.log" 2>&1 ||
    { echo "$tag failed: $(tail -1 "$out/$tag.log")"; return; }
  gzip -9 -n -c "$out/$tag/metrics.jsonl" > "$docs/$name-$tag.jsonl.gz"
  rm -rf "${out:?}/$tag"
  summary "$docs/$name-$tag.jsonl.gz" "$tag"
}
i=0
for j in "${jobs[@]}"; do
  # shellcheck disable=SC2086
  run $j &
  i=$((i + 1))
  if ((i % ${JOBS:-2} == 0)); then wait; fi
done
wait
