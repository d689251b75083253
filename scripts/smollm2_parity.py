#!/usr/bin/env python3
"""SmolLM2-135M-Instruct: rlft's per-token log-probs and greedy tokens against transformers,
which dequantises the same GGUF to float32.

    pip install torch transformers gguf accelerate
    cargo build --release --example score
    python3 scripts/smollm2_parity.py [--gguf models/SmolLM2-135M-Instruct.Q4_1.gguf]

For each prompt: ids from rlft's GGUF tokenizer (`score --json`), transformers' log p(ids[t+1] |
ids[..=t]) on the same ids, max |Δ| (target ≤ 2e-3), and 24 greedy tokens from both (KV cache,
EOS not stopping). Prints one JSON line per prompt and a summary; exits 1 on a miss.
"""
import argparse
import json
import os
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Water boils at 100 degrees Celsius at sea level, but on a high mountain it",
    "<|im_start|>user\nWhat is 17 + 25?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village by the sea, there lived",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--score", default=os.environ.get("CARGO_TARGET_DIR", "target") + "/release/examples/score")
    ap.add_argument("--greedy", type=int, default=24)
    args = ap.parse_args()
    torch.set_num_threads(2)
    d, f = os.path.split(os.path.abspath(args.gguf))
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    worst, ok = 0.0, True
    for text in PROMPTS:
        out = subprocess.run([args.score, "--model", args.gguf, "--text", text, "--greedy",
                              str(args.greedy), "--json"], check=True, capture_output=True, text=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        ids = torch.tensor([r["ids"]])
        with torch.no_grad():
            lp = torch.log_softmax(model(ids).logits.float(), -1)[0, :-1]
            ref = lp.gather(-1, ids[0, 1:, None])[:, 0]
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=args.greedy, min_new_tokens=args.greedy,
                                 pad_token_id=2)[0, ids.shape[1]:].tolist()
        diff = float((ref - torch.tensor(r["logprobs"])).abs().max()) if len(r["logprobs"]) else 0.0
        same = gen == r["greedy_ids"]
        worst = max(worst, diff)
        ok &= diff <= 2e-3 and same
        print(json.dumps({"text": text[:40], "n_ids": len(r["ids"]), "max_abs_logprob_diff": diff,
                          "greedy_identical": same}))
    print(json.dumps({"max_abs_logprob_diff": worst, "all_ok": ok}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
