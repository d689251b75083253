#!/usr/bin/env python3
"""Checks a GGUF file written by `rlft export --gguf` with llama.cpp itself (llama-cpp-python).

For each text, llama.cpp's tokenization must equal rlft's, and the per-token log-probs of
llama.cpp's forward pass are compared with rlft's (`examples/score.rs --json`); llama.cpp's
greedy continuation is compared too. Prints one JSON line per text and a summary line.

    pip install llama-cpp-python      # builds llama.cpp (a few minutes on two cores)
    cargo build --release --example score
    python3 scripts/gguf_llamacpp_check.py MODEL.gguf [--score PATH] [--text TEXT]...

Exit status 1 when a tokenization differs or a log-prob differs by more than --tol (default
1e-3: llama.cpp computes in f32 with its own kernels and reduction order).
"""
import argparse
import json
import math
import pathlib
import subprocess
import sys

from llama_cpp import Llama

TEXTS = [
    "What is 3 + 4? Answer with the number.",
    "Hello, world!! 12345 and 3.14159; x  2",
    "The quick brown fox\n\n  jumps 12 times.\t9",
]

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument(
    "--score",
    default=str(pathlib.Path(__file__).resolve().parent.parent / "target/release/examples/score"),
    help="the score example's binary",
)
ap.add_argument("--text", action="append")
ap.add_argument("--greedy", type=int, default=8)
ap.add_argument("--tol", type=float, default=1e-3)
args = ap.parse_args()

# An f32 KV cache (llama.cpp's default is f16, which alone moves log-probs by ~1e-2).
llm = Llama(model_path=args.model, logits_all=True, n_ctx=512, n_threads=2, verbose=False,
            type_k=0, type_v=0)
worst, failed = 0.0, False
for text in args.text or TEXTS:
    out = subprocess.run(
        [args.score, "--model", args.model, "--text", text, "--greedy", str(args.greedy), "--json"],
        capture_output=True, text=True, check=True,
    )
    rlft = json.loads(out.stdout.strip().splitlines()[-1])
    ids = llm.tokenize(text.encode(), add_bos=False, special=True)
    same_tokens = ids == rlft["ids"]
    llm.reset()
    llm.eval(ids)
    diffs = []
    for t in range(len(ids) - 1):
        row = llm.scores[t]
        m = max(row)
        lse = m + math.log(sum(math.exp(x - m) for x in row))
        diffs.append(abs(float(row[ids[t + 1]]) - float(lse) - rlft["logprobs"][t]))
    greedy = []
    llm.reset()
    for tok in llm.generate(ids, temp=0.0, top_k=1):
        greedy.append(tok)
        if len(greedy) == args.greedy:
            break
    d = float(max(diffs, default=0.0))
    worst = max(worst, d)
    failed |= not same_tokens or d > args.tol
    print(json.dumps({
        "text": text,
        "tokens_equal": same_tokens,
        "max_abs_dlogprob": d,
        "greedy_equal": greedy == rlft["greedy_ids"],
        "n_tokens": len(ids),
    }))
print(json.dumps({"model": args.model, "max_abs_dlogprob": worst, "ok": not failed}))
sys.exit(1 if failed else 0)
