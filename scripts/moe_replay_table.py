#!/usr/bin/env python3
"""The router-replay table from docs/runs/moe-replay (scripts/moe_replay_runs.sh): per arm,
held-out greedy accuracy after the warm-up and at the end, and the mean of moe/routing_mismatch and
moe/router_drift over the RL steps; medians and ranges over the seeds (each run's wall time is
kept in its file as `wall_s`).

    python3 scripts/moe_replay_table.py [FOLDER]
"""
import glob
import gzip
import json
import os
import statistics
import sys


def runs(folder, arm):
    out = []
    for path in sorted(glob.glob(os.path.join(folder, f"{arm}-seed*.jsonl.gz"))):
        rows = [json.loads(l) for l in gzip.open(path, "rt") if l.strip()]
        wall = next((r["wall_s"] for r in rows if "wall_s" in r), None)
        steps = [r for r in rows if r.get("step", 0) > 0 and "moe/router_drift" in r]
        evals = [r for r in rows if "eval/accuracy" in r]
        if not steps or not evals:
            continue
        out.append({
            "seed": int(path.split("seed")[-1].split(".")[0]),
            "start": evals[0]["eval/accuracy"],
            "end": evals[-1]["eval/accuracy"],
            "mismatch": statistics.mean(r["moe/routing_mismatch"] for r in steps),
            "drift": statistics.mean(r["moe/router_drift"] for r in steps),
            "wall": wall,
        })
    return out


def summary(values, fmt):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else "docs/runs/moe-replay"
    print("| router replay | seeds | held-out after warm-up | held-out at the end | reached goal | "
          "moe/routing_mismatch | moe/router_drift |")
    print("|---|---|---|---|---|---|---|")
    for arm, label in [("replay", "on"), ("free", "off")]:
        r = runs(folder, arm)
        if not r:
            continue
        goal = sum(1 for x in r if x["end"] >= 0.9 and x["end"] - x["start"] >= 0.3)
        print(f"| {label} | {len(r)} | {summary([x['start'] for x in r], '{:.2f}')} | "
              f"{summary([x['end'] for x in r], '{:.2f}')} | {goal} of {len(r)} | "
              f"{summary([x['mismatch'] for x in r], '{:.4f}')} | "
              f"{summary([x['drift'] for x in r], '{:.4f}')} |")
    print("\nmedian (min–max) over the seeds; mismatch and drift are means over each run's 120 RL steps")


if __name__ == "__main__":
    main()
