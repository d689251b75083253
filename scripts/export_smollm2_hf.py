#!/usr/bin/env python3
"""SmolLM2-135M-Instruct GGUF → plain HF safetensors folder with transformers' own GGUF loader
(dequantised to float32), for `python3 scripts/bench_hf.py --model build/smollm2-hf`.

    pip install torch transformers gguf accelerate
    python3 scripts/export_smollm2_hf.py [--gguf models/SmolLM2-135M-Instruct.Q4_1.gguf] [--out build/smollm2-hf]

On transformers 5.24 `save_pretrained` refuses a model loaded from a GGUF ("quantized with gguf
... not serializable"); this script drops the quantizer marker first. The tokenizer is saved as
transformers reads it from the GGUF, without repairs (eos, digit split): they do not matter for
timing.
"""
import argparse
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ap = argparse.ArgumentParser()
ap.add_argument("--gguf", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
ap.add_argument("--out", default="build/smollm2-hf")
args = ap.parse_args()
d, f = os.path.split(os.path.abspath(args.gguf))
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
model.hf_quantizer = None
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.is_quantized = False
model.save_pretrained(args.out, safe_serialization=True)
tok.save_pretrained(args.out)
print(args.out)
