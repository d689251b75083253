#!/usr/bin/env python3
"""PyTorch's f32 matrix product at the learner's shapes (benches/model.rs, group matmul_f32).

    python3 scripts/matmul_torch.py [--threads 2]

Prints GFLOP/s per shape, best of 5 runs of 20 products each, for 1 thread and for --threads.
"""
import argparse
import time

import torch

SHAPES = [(560, 576, 576), (560, 576, 1536), (560, 1536, 576), (576, 560, 1536), (240, 576, 49152)]

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()
for threads in sorted({1, args.threads}):
    torch.set_num_threads(threads)
    for m, k, n in SHAPES:
        a, b = torch.ones(m, k), torch.ones(k, n)
        for _ in range(3):
            a @ b
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(20):
                a @ b
            best = min(best, (time.perf_counter() - t) / 20)
        print(f"threads={threads} {m}x{k}x{n}: {2 * m * n * k / best / 1e9:.0f} GFLOP/s")
