#!/usr/bin/env bash
# Checks that the trainer in this checkout reproduces a recipe's run at an earlier commit bit for
# bit: every metric but the timing ones (time/*, tokens_per_s, async/*: throughput and idle
# fractions of the asynchronous pipeline, server/*: the rollout servers), and the final weights.
# REMOVED lists metric keys dropped on purpose since the reference (reward/total, which always
# equalled reward/mean; eval/mean_at_k, the old name of eval/mean@<k>).
# For refactors that must not change training (the stage split of the trainer, new settings
# whose default is off).
#
#   scripts/sync_reference.sh REF [RECIPE] [--set KEY=VALUE]...
#
# REF is a git commit; RECIPE defaults to recipes/quickstart.toml. The earlier commit is built in
# a temporary worktree with its own target dir (cargo hashes path crates relative to the
# workspace root, so two worktrees must not share one); when this checkout's release dir exists
# it is hard-linked in, so only the rlft crates are rebuilt. Metrics keys that only the newer run
# has are reported, not compared.
set -euo pipefail
cd "$(dirname "$0")/.."
ref=${1:?usage: scripts/sync_reference.sh REF [RECIPE] [--set KEY=VALUE]...}
shift
recipe=recipes/quickstart.toml
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then recipe=$1; shift; fi
target=${CARGO_TARGET_DIR:-$HOME/.cache/rlft-target}
work=$(mktemp -d)
trap 'git worktree remove --force "$work/src" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add -q --detach "$work/src" "$ref"
if [ -d "$target/release" ]; then
  mkdir -p "$work/target"
  cp -al "$target/release" "$work/target/release"
  rm -rf "$work/target/release/.fingerprint"
  cp -a "$target/release/.fingerprint" "$work/target/release/.fingerprint"
  rm -rf "$work"/target/release/.fingerprint/rlft* "$work"/target/release/deps/*rlft* \
    "$work"/target/release/incremental "$work"/target/release/examples
fi
(cd "$work/src" && CARGO_TARGET_DIR="$work/target" cargo build --release --example train -q)
cargo build --release --example train -q
sets=(--set logging.progress=false)
for a in "$@"; do sets+=("$a"); done
"$work/target/release/examples/train" "$recipe" --set "output_dir=\"$work/old\"" "${sets[@]}" \
  >"$work/old.log"
"$target/release/examples/train" "$recipe" --set "output_dir=\"$work/new\"" "${sets[@]}" \
  >"$work/new.log"
python3 - "$work/old" "$work/new" <<'EOF'
import json, sys
old, new = sys.argv[1], sys.argv[2]
a = [json.loads(l) for l in open(f"{old}/metrics.jsonl")]
b = [json.loads(l) for l in open(f"{new}/metrics.jsonl")]
REMOVED = {"reward/total", "eval/mean_at_k"}  # metric keys dropped on purpose since the reference commit
skip = lambda k: (k.startswith(("time/", "async/", "server/")) or k == "tokens_per_s"
                  or k in REMOVED)
diffs = [(x["step"], k, x[k], y.get(k)) for x, y in zip(a, b) for k in x
         if not skip(k) and x[k] != y.get(k)]
added = sorted(set().union(*map(set, b)) - set().union(*map(set, a)))
w = open(f"{old}/final/model.safetensors", "rb").read() == open(f"{new}/final/model.safetensors", "rb").read()
print(f"{len(a)} vs {len(b)} lines, {len(diffs)} differing values, final weights "
      f"{'identical' if w else 'DIFFER'}; keys only in the new run: {', '.join(added) or 'none'}")
for d in diffs[:10]:
    print("  step {}: {} {} -> {}".format(*d))
sys.exit(0 if not diffs and w and len(a) == len(b) else 1)
EOF
