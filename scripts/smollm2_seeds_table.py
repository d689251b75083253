#!/usr/bin/env python3
"""The seed table of recipes/grpo-smollm2-arith.toml from docs/runs/grpo-smollm2-arith
(scripts/smollm2_seeds.sh): per seed, held-out greedy accuracy (`eval/accuracy`) at every
evaluation, sampled accuracy at T = 1 (`eval/mean@2`) before and after, and the run's wall
time; then the mean and the range over the seeds. A second table gives, per evaluation step, the
means over the seeds of the held-out and training accuracy, the KL to the reference and the
response length (training metrics are those of the step itself).

    python3 scripts/smollm2_seeds_table.py [FOLDER] [--steps N]

With --steps N it reads the runs of N RL steps (`STEPS=N scripts/smollm2_seeds.sh`,
stepsN-seedM.jsonl.gz) instead of the recipe's.
"""
import glob
import gzip
import json
import os
import re
import statistics
import sys


def runs(folder, prefix):
    out = []
    for path in glob.glob(os.path.join(folder, f"{prefix}seed*.jsonl.gz")):
        rows = [json.loads(l) for l in gzip.open(path, "rt") if l.strip()]
        evals = [r for r in rows if "eval/accuracy" in r]
        if not evals:
            continue
        out.append({
            "seed": int(re.search(r"seed(\d+)\.jsonl\.gz$", path)[1]),
            "evals": {r["step"]: r for r in evals},
            "steps": {r["step"]: r for r in rows if "step" in r},
            "wall": next((r["wall_s"] for r in rows if "wall_s" in r), None),
        })
    return sorted(out, key=lambda r: r["seed"])


def spread(values):
    return f"{statistics.mean(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main():
    args = sys.argv[1:]
    prefix = ""
    if "--steps" in args:
        i = args.index("--steps")
        prefix = f"steps{args[i + 1]}-"
        del args[i:i + 2]
    folder = args[0] if args else "docs/runs/grpo-smollm2-arith"
    rs = runs(folder, prefix)
    if not rs:
        sys.exit(f"no {prefix}seed*.jsonl.gz with evaluations in {folder}: run scripts/smollm2_seeds.sh")
    steps = sorted(set.intersection(*(set(r["evals"]) for r in rs)))
    first, last = steps[0], steps[-1]
    head = " | ".join(f"step {s}" for s in steps)
    print(f"| seed | eval/accuracy: {head} | gain | eval/mean@2: step {first} → {last} | wall s |")
    print("|---|" + "---|" * len(steps) + "---|---|---|")
    for r in rs:
        acc = [r["evals"][s]["eval/accuracy"] for s in steps]
        mean2 = [r["evals"][s]["eval/mean@2"] for s in (first, last)]
        wall = f"{r['wall']:.0f}" if r["wall"] is not None else "-"
        print(f"| {r['seed']} | " + " | ".join(f"{a:.2f}" for a in acc)
              + f" | {acc[-1] - acc[0]:+.2f} | {mean2[0]:.2f} → {mean2[1]:.2f} | {wall} |")
    cols = [spread([r["evals"][s]["eval/accuracy"] for r in rs]) for s in steps]
    gain = spread([r["evals"][last]["eval/accuracy"] - r["evals"][first]["eval/accuracy"] for r in rs])
    m2 = [spread([r["evals"][s]["eval/mean@2"] for r in rs]) for s in (first, last)]
    walls = [r["wall"] for r in rs if r["wall"] is not None]
    wall = f"{statistics.mean(walls):.0f} ({min(walls):.0f}–{max(walls):.0f})" if walls else "-"
    print(f"| mean (min–max) | " + " | ".join(cols) + f" | {gain} | {m2[0]} → {m2[1]} | {wall} |")
    print()
    print("| RL step | eval/accuracy | eval/mean@2 | train accuracy | kl | response tokens |")
    print("|---|---|---|---|---|---|")
    for s in steps:
        cells = [statistics.mean(r["evals"][s][k] for r in rs) for k in ("eval/accuracy", "eval/mean@2")]
        train = [r["steps"][s] for r in rs if "accuracy" in r["steps"][s]]
        line = f"| {s} | {cells[0]:.2f} | {cells[1]:.2f} |"
        if train:
            line += (f" {statistics.mean(t['accuracy'] for t in train):.2f} |"
                     f" {statistics.mean(t['kl'] for t in train):.3f} |"
                     f" {statistics.mean(t['response_len/mean'] for t in train):.1f} |")
        else:
            line += " — | — | — |"
        print(line)
    print(f"\nmeans over seeds {', '.join(str(r['seed']) for r in rs)}")


if __name__ == "__main__":
    main()
