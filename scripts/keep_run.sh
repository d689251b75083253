# Sourced by the measuring scripts (scripts/moe_replay_runs.sh, scripts/smollm2_seeds.sh).
#
#   keep_run RUN_DIR OUT.jsonl.gz LOG COMMAND...
# runs COMMAND (stdout and stderr into LOG), then keeps RUN_DIR/metrics.jsonl, with the command's
# wall time appended as a last line {"wall_s": S}, gzipped as OUT.jsonl.gz (written to a
# temporary file first, so an interrupted run leaves no partial file).
keep_run() {
  local dir=$1 out=$2 log=$3 start end
  shift 3
  start=$(date +%s.%N)
  "$@" > "$log" 2>&1
  end=$(date +%s.%N)
  python3 - "$dir/metrics.jsonl" "$(echo "$end - $start" | bc)" <<'PY' | gzip -n > "$out.tmp"
import json, sys
for line in open(sys.argv[1]):
    print(line.rstrip())
print(json.dumps({"wall_s": float(sys.argv[2])}))
PY
  mv "$out.tmp" "$out"
}
