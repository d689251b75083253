#!/usr/bin/env python3
"""The staleness experiment's table from its metrics files (scripts/staleness_experiment.sh).

One row per lag and arm, over the seeds found: the final held-out accuracy of each seed, the first
evaluation step whose held-out accuracy is >= 0.9 (each seed; '-' when never), the mismatch KL
between mu and the policy the arm compares it with (offpolicy/kl, k1), averaged over every RL step
of every seed, and the mean seconds per RL step (time/step_s). After each table: whether the sound
arms (staleness_runs.SOUND) separate at the largest lag (best and worst sound arm's mean final
accuracy differ by >= 0.10 and by more than the seed spread, the larger of the two arms' max - min
over seeds), then each arm's diagnostics at that lag.

    python3 scripts/staleness_table.py [FOLDER] [--recipe NAME]
        FOLDER: docs/runs/staleness by default; NAME: only that recipe's runs
"""
import argparse
import pathlib
import sys
from collections import defaultdict

from staleness_runs import ARMS, ORDER, PATTERN, SOUND, read_rows

parser = argparse.ArgumentParser()
parser.add_argument("folder", nargs="?", default="docs/runs/staleness")
parser.add_argument("--recipe")
args = parser.parse_args()

def split_name(head):
    """(recipe, arm) of '<recipe>-<arm>'; recipe and arm names may both contain dashes."""
    if args.recipe:
        return (args.recipe, head[len(args.recipe) + 1 :]) if head.startswith(args.recipe + "-") else None
    # The recipes in the repository, longest first; then the arms the experiment script defines.
    for stem in sorted((p.stem for p in pathlib.Path("recipes").glob("*.toml")), key=len, reverse=True):
        if head.startswith(stem + "-"):
            return stem, head[len(stem) + 1 :]
    for arm in ARMS:
        if head.endswith("-" + arm):
            return head[: -len(arm) - 1], arm
    return None


runs = defaultdict(dict)
for f in sorted(pathlib.Path(args.folder).glob("*.jsonl.gz")):
    m = PATTERN.fullmatch(f.name)
    names = split_name(m.group(1)) if m else None
    if not names or not names[1]:
        if not args.recipe:
            print(f"skipped {f.name}: not <recipe>-<arm>-lag<L>-seed<S>.jsonl.gz", file=sys.stderr)
        continue
    (recipe, arm), lag, seed = names, int(m.group(2)), int(m.group(3))
    runs[(recipe, lag, arm)][seed] = read_rows(f)
# The script's arms in their order, then any other arm by name.
ORDER = ORDER + sorted({k[2] for k in runs} - set(ORDER))


def mean(v):
    return sum(v) / len(v) if v else None


def sci(x):
    return "–" if x is None else f"{x:.1e}"


for recipe in sorted({k[0] for k in runs}):
    if not args.recipe:
        print(f"\n{recipe}\n")
    print("| lag | arm | final held-out accuracy (seeds) | steps to 0.9 | mean `offpolicy/kl` | step s |")
    print("|---|---|---|---|---|---|")
    lags = sorted({k[1] for k in runs if k[0] == recipe})
    finals_at = {}
    for lag in lags:
        for arm in ORDER:
            seeds = runs.get((recipe, lag, arm))
            if not seeds:
                continue
            finals, firsts, kl, step_s = [], [], [], []
            for s in sorted(seeds):
                rows = seeds[s]
                evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
                finals.append(evals[-1][1])
                hit = [st for st, a in evals if a >= 0.9]
                firsts.append(str(hit[0]) if hit else "-")
                kl += [r["offpolicy/kl"] for r in rows if "offpolicy/kl" in r]
                step_s += [r["time/step_s"] for r in rows if r.get("step", 0) > 0 and "time/step_s" in r]
            finals_at[(lag, arm)] = finals
            print(
                f"| {lag} | `{arm}` | {' / '.join(f'{a:.2f}' for a in finals)} "
                f"| {' / '.join(firsts)} | {sci(mean(kl))} | {mean(step_s):.3f} |"
            )
    top = lags[-1]
    # Separation is judged on the sound arms.
    at_top = {a: f for (lag, a), f in finals_at.items() if lag == top and a in SOUND}
    if len(at_top) > 1:
        best = max(at_top, key=lambda a: mean(at_top[a]))
        worst = min(at_top, key=lambda a: mean(at_top[a]))
        gap = mean(at_top[best]) - mean(at_top[worst])
        spread = max(max(at_top[a]) - min(at_top[a]) for a in (best, worst))
        if min(len(at_top[best]), len(at_top[worst])) < 2:
            verdict = "cannot be judged (one seed, so no spread)"
        else:
            verdict = "separate" if gap >= 0.10 and gap > spread else "do not separate"
        print(
            f"\nAt lag {top} the sound arms {verdict}: best `{best}` {mean(at_top[best]):.3f}, worst "
            f"`{worst}` {mean(at_top[worst]):.3f} (mean final accuracy), a gap of {gap:.3f} "
            f"against a seed spread of {spread:.3f}."
        )
    # What explains the ranking at the largest lag, per arm over every RL step of every seed.
    print(
        f"\nDiagnostics at lag {top} (means over the RL steps of every seed; IS columns only for "
        "arms with IS weights):\n"
    )
    print("| arm | `clip_frac/low` | `clip_frac/high` | IS ESS | IS weights outside | steps with zero gradient |")
    print("|---|---|---|---|---|---|")
    for arm in ORDER:
        seeds = runs.get((recipe, top, arm))
        if not seeds:
            continue
        steps = [r for s in sorted(seeds) for r in seeds[s] if r.get("step", 0) > 0]
        col = lambda k: mean([r[k] for r in steps if k in r])
        ess = col("offpolicy/rollout_is_eff_sample_size")
        out = [
            r["offpolicy/rollout_is_ratio_fraction_high"] + r["offpolicy/rollout_is_ratio_fraction_low"]
            for r in steps
            if "offpolicy/rollout_is_ratio_fraction_high" in r
        ]
        zero = sum(1 for r in steps if r.get("grad_norm") == 0)
        fmt = lambda x: "–" if x is None else f"{x:.3f}"
        print(
            f"| `{arm}` | {fmt(col('clip_frac/low'))} | {fmt(col('clip_frac/high'))} | {fmt(ess)} "
            f"| {fmt(mean(out))} | {zero} of {len(steps)} |"
        )
