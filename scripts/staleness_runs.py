"""The staleness experiment's arms and metrics files (scripts/staleness_experiment.sh), shared by
scripts/staleness_table.py and scripts/staleness_plot.py."""
import gzip
import json
import re

# The arms that take mu into account and sample as `none` does, in the script's order:
# separation is judged on them (not `recompute`, which ignores mu, nor the top-p arms).
SOUND = [
    "none",
    "decoupled-tis",
    "decoupled-icepop",
    "ctpo-mu",
    "decoupled-m2po",
    "opsm-trl",
    "vespo",
    "decoupled-tis-loglinear",
]
# Every arm of the experiment script, in its order.
ORDER = [SOUND[0], "recompute", *SOUND[1:], "none-topp", "replay-topp", "replay-topp-penalty"]
# Longest names first, so a name that extends another is matched whole.
ARMS = sorted(ORDER, key=len, reverse=True)
# A metrics file: <recipe>-<arm>-lag<L>-seed<S>.jsonl.gz
PATTERN = re.compile(r"(.+)-lag(\d+)-seed(\d+)\.jsonl\.gz")


def read_rows(path):
    """The metrics lines of one run."""
    return [json.loads(line) for line in gzip.open(path, "rt") if line.strip()]
