#!/usr/bin/env python3
"""Greedy answers of an exported policy to every single-digit sum `a + b`, printed as a 10 × 10
grid of `answer − (a + b)` (0 = right, `?` = no number); `*` marks the held-out sums (the same
split as `rlft_rollout::Task`: FNV-1a of the question, multiple of 10). For looking at what an
SFT warm-up or an RL run made of the quickstart's task, e.g. the warmed-up policy of a seed:

    cargo run --release --example train -- recipes/quickstart.toml --set seed=7 \\
        --set output_dir=runs/warm7 --set schedule.steps=1 --set optimizer.lr=1e-12 \\
        --set optimizer.weight_decay=0.0
    pip install torch transformers
    python3 scripts/arith_grid.py runs/warm7/final
"""
import sys

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast


def fnv(s):
    h = 0xCBF29CE484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001B3) % (1 << 64)
    return h


def main(path):
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = PreTrainedTokenizerFast(tokenizer_file=f"{path}/tokenizer.json")
    right = {"train": [0, 0], "held out": [0, 0]}
    print("a\\b " + " ".join(f"{b:>4}" for b in range(10)))
    for a in range(10):
        cells = []
        for b in range(10):
            ids = tok(f"What is {a} + {b}? Answer with the number.")["input_ids"]
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)
            text = tok.decode(out[0][len(ids):])
            digits = "".join(c for c in text if c.isdigit())
            held = fnv(f"{a} + {b}") % 10 == 0
            split = right["held out" if held else "train"]
            split[1] += 1
            if digits:
                diff = int(digits) - (a + b)
                split[0] += diff == 0
                cell = f"{diff:+d}" if diff else "0"
            else:
                cell = "?"
            cells.append(f"{('*' if held else '') + cell:>4}")
        print(f"{a:>3} " + " ".join(cells))
    for name, (ok, n) in right.items():
        print(f"{name}: {ok} of {n} sums right")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: arith_grid.py EXPORTED_POLICY_DIR (an output_dir's final/)")
    main(sys.argv[1])
