#!/usr/bin/env python3
"""The staleness experiment's table from its metrics files (scripts/staleness_experiment.sh).

Per recipe, arm and lag, over the seeds found: held-out accuracy at the end (each seed), the
first evaluation step with held-out accuracy >= 0.9 (each seed; '-' when never), and the mismatch
KL between mu and the policy the arm compares it with, averaged over every RL step of every seed
(offpolicy/kl, k1, and offpolicy/k3_kl).

    python3 scripts/staleness_table.py [docs/runs/staleness]
"""
import gzip
import json
import pathlib
import re
import sys
from collections import defaultdict

ARMS = ["none", "recompute", "decoupled-tis", "decoupled-icepop", "ctpo-mu"]
folder = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "docs/runs/staleness")
runs = defaultdict(dict)
for f in sorted(folder.glob("*.jsonl.gz")):
    m = re.fullmatch(r"(.+)-(" + "|".join(ARMS) + r")-lag(\d+)-seed(\d+)\.jsonl\.gz", f.name)
    if not m:
        continue
    recipe, arm, lag, seed = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
    rows = [json.loads(l) for l in gzip.open(f, "rt") if l.strip()]
    runs[(recipe, lag, arm)][seed] = rows

def fmt(x):
    return "–" if x is None else f"{x:.1e}"

for recipe in sorted({k[0] for k in runs}):
    print(f"\n{recipe}\n")
    print("| lag | arm | final held-out accuracy (seeds) | first eval step ≥ 0.9 | mean `offpolicy/kl` | mean `offpolicy/k3_kl` |")
    print("|---|---|---|---|---|---|")
    for lag in sorted({k[1] for k in runs if k[0] == recipe}):
        for arm in ARMS:
            seeds = runs.get((recipe, lag, arm))
            if not seeds:
                continue
            finals, firsts, kl, k3 = [], [], [], []
            for s in sorted(seeds):
                rows = seeds[s]
                evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
                finals.append(f"{evals[-1][1]:.2f}")
                hit = [st for st, a in evals if a >= 0.9]
                firsts.append(str(hit[0]) if hit else "-")
                kl += [r["offpolicy/kl"] for r in rows if "offpolicy/kl" in r]
                k3 += [r["offpolicy/k3_kl"] for r in rows if "offpolicy/k3_kl" in r]
            mean = lambda v: sum(v) / len(v) if v else None
            print(f"| {lag} | `{arm}` | {' / '.join(finals)} | {' / '.join(firsts)} | {fmt(mean(kl))} | {fmt(mean(k3))} |")
