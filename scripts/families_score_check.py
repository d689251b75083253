#!/usr/bin/env python3
"""Parity of every model-family fixture through `score --json`: for each checkpoint folder in
tests/data/fixtures-families (or the folder given), score the `long` case's ids and compare the
per-token log-probs with transformers' `next_token_logprob` and the 8 greedy ids with its
`greedy_ids`. Prints one line per fixture and `N passed, M failed`; exits 1 on a failure.

    cargo build --release --example score
    python3 scripts/families_score_check.py [FOLDER] [--tol 1e-4]

Only the standard library is needed.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    tol = 1e-4
    if "--tol" in sys.argv:
        tol = float(sys.argv[sys.argv.index("--tol") + 1])
        args = [a for a in args if a != str(sys.argv[sys.argv.index("--tol") + 1])]
    base = args[0] if args else os.path.join(ROOT, "tests/data/fixtures-families")
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    score = os.path.join(target, "release/examples/score")
    if not os.path.exists(score):
        sys.exit(f"{score} is missing: run `cargo build --release --example score` first")
    passed = failed = 0
    for name in sorted(os.listdir(base)):
        folder = os.path.join(base, name)
        if not os.path.exists(os.path.join(folder, "config.json")):
            continue
        with open(os.path.join(folder, "expected.json")) as f:
            case = json.load(f)["cases"][0]
        ids = ",".join(str(i) for i in case["input_ids"])
        greedy = len(case["greedy_ids"])
        out = subprocess.run(
            [score, "--model", folder, "--ids", ids, "--greedy", str(greedy),
             "--device", "flex", "--json"],
            capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{name}: FAILED (score exited {out.returncode}: {out.stderr.strip()[-300:]})")
            failed += 1
            continue
        got = json.loads(out.stdout.strip().splitlines()[-1])
        want = case["next_token_logprob"]
        diff = max(abs(a - b) for a, b in zip(got["logprobs"], want))
        same = got["greedy_ids"] == case["greedy_ids"]
        ok = diff <= tol and same and len(got["logprobs"]) == len(want)
        print(f"{name}: max |Δ log-prob| = {diff:.2e}, greedy ids "
              f"{'identical' if same else 'DIFFER'}: {'ok' if ok else 'FAILED'}")
        passed += ok
        failed += not ok
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
