#!/usr/bin/env python3
"""Reference blocks for rlft-model's dequantiser tests.

    pip install gguf numpy && python3 scripts/make_quant_blocks.py > crates/rlft-model/tests/data/quant_blocks.json

For each ggml type: two blocks of deterministic pseudo-random bytes (block scales set to finite
f16 values) and their float32 values as dequantised by gguf-py, llama.cpp's own Python package.
"""
import importlib.metadata
import json
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

# byte offsets of f16 scale fields inside one block
F16_FIELDS = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q8_0: [0], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}

rng = np.random.default_rng(1234)
out = {"gguf_py": importlib.metadata.version("gguf"), "cases": []}
for ty, fields in F16_FIELDS.items():
    n, nbytes = GGML_QUANT_SIZES[ty]
    blocks = rng.integers(0, 256, size=(2, nbytes), dtype=np.uint8)
    for b in blocks:
        for off in fields:
            b[off:off + 2] = np.frombuffer(np.float16(rng.uniform(0.01, 0.2)).tobytes(), dtype=np.uint8)
    raw = blocks.reshape(-1)
    values = quants.dequantize(raw, ty).reshape(-1).astype(np.float32)
    out["cases"].append({"type": ty.name, "bytes": raw.tolist(), "values": [float(v) for v in values]})
json.dump(out, sys.stdout)
