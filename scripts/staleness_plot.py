#!/usr/bin/env python3
"""Final held-out accuracy against lag, one line per sound arm (the mean over seeds) with the
seed spread (min to max) shaded, from the staleness experiment's metrics files.

The quickstart and the staleness testbed are one recipe at different lags (the testbed is the
quickstart with `[async] lag = 128`), so their runs are drawn on one axis: lags 0-64 from
`quickstart-*`, 128 from `staleness-testbed-*`.

    python3 scripts/staleness_plot.py [OUT]    (default docs/img/staleness-accuracy-vs-lag.png)

Needs matplotlib (`pip install matplotlib`).
"""
import pathlib
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from staleness_runs import PATTERN, SOUND, read_rows  # noqa: E402

RECIPES = ["quickstart", "staleness-testbed"]
folder = pathlib.Path("docs/runs/staleness")
out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img/staleness-accuracy-vs-lag.png")

finals = defaultdict(lambda: defaultdict(list))  # arm -> lag -> [final accuracy per seed]
for f in sorted(folder.glob("*.jsonl.gz")):
    m = PATTERN.fullmatch(f.name)
    if not m:
        continue
    head, lag = m.group(1), int(m.group(2))
    for recipe in RECIPES:
        arm = head[len(recipe) + 1 :] if head.startswith(recipe + "-") else None
        if arm in SOUND:
            evals = [r["eval/accuracy"] for r in read_rows(f) if "eval/accuracy" in r]
            finals[arm][lag].append(evals[-1])

fig, ax = plt.subplots(figsize=(8, 4.8))
for arm in SOUND:
    lags = sorted(finals[arm])
    if not lags:
        continue
    mean = [sum(finals[arm][k]) / len(finals[arm][k]) for k in lags]
    low = [min(finals[arm][k]) for k in lags]
    high = [max(finals[arm][k]) for k in lags]
    (line,) = ax.plot(lags, mean, marker="o", label=arm)
    ax.fill_between(lags, low, high, color=line.get_color(), alpha=0.12)
ax.set_xscale("symlog", linthresh=8)
ticks = sorted({k for arm in finals for k in finals[arm]})
ax.set_xticks(ticks)
ax.set_xticklabels([str(k) for k in ticks])
ax.set_xlabel("lag (policy versions between the sampler and the learner)")
ax.set_ylabel("final held-out accuracy (mean; min-max over seeds shaded)")
ax.set_ylim(-0.02, 1.05)
ax.set_title("Sound corrections against staleness (quickstart: 3 seeds at lags 0-64, 5 at 128)")
ax.legend(fontsize=8, loc="lower left")
ax.grid(alpha=0.3)
fig.tight_layout()
out.parent.mkdir(parents=True, exist_ok=True)
tmp = out.with_suffix(".tmp" + out.suffix)
fig.savefig(tmp, dpi=110)
tmp.replace(out)
print(f"wrote {out}")
