#!/usr/bin/env python3
"""PyTorch's f32 matrix product at the learner's shapes and layouts (benches/model.rs, group
matmul_f32: the same products, each operand a transposed view where rlft's is).

    python3 scripts/matmul_torch.py [--threads 2]

Prints GFLOP/s per product, best of 5 runs of 20 products each, for 1 thread and for --threads.
"""
import argparse
import time

import torch

# (name, m, k, n, lhs transposed, rhs transposed), as LEARNER_PRODUCTS in benches/model.rs.
PRODUCTS = [
    ("q_o_fwd", 560, 576, 576, False, False),
    ("q_o_dx", 560, 576, 576, False, True),
    ("q_o_dw", 576, 560, 576, True, False),
    ("gate_up_fwd", 560, 576, 1536, False, False),
    ("gate_up_dx", 560, 1536, 576, False, True),
    ("gate_up_dw", 576, 560, 1536, True, False),
    ("down_fwd", 560, 1536, 576, False, False),
    ("down_dx", 560, 576, 1536, False, True),
    ("down_dw", 1536, 560, 576, True, False),
    ("head_fwd", 240, 576, 49152, False, True),
    ("head_dh", 240, 49152, 576, False, False),
    ("head_de", 49152, 240, 576, True, False),
]


def operand(rows, cols, transposed):
    return torch.ones(cols, rows).t() if transposed else torch.ones(rows, cols)


ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()
for threads in sorted({1, args.threads}):
    torch.set_num_threads(threads)
    for name, m, k, n, lhs_t, rhs_t in PRODUCTS:
        a, b = operand(m, k, lhs_t), operand(k, n, rhs_t)
        for _ in range(3):
            a @ b
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(20):
                a @ b
            best = min(best, (time.perf_counter() - t) / 20)
        print(f"threads={threads} {name}/{m}x{k}x{n}: {2 * m * n * k / best / 1e9:.0f} GFLOP/s")
