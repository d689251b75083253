#!/usr/bin/env python3
"""Converts the family fixtures to GGUF with llama.cpp's own converter.

The files it writes (tests/data/fixtures-families-gguf/<fixture>.gguf) are what rlft's GGUF
loader is checked against: tensors, names, norm offsets, fused and stacked layouts and the
hyperparameter keys all come from `convert_hf_to_gguf.py`. Two things are adapted, because the
fixtures are tiny random checkpoints rather than published ones:

* the vocabulary: Gemma's and Phi-3's converters expect a SentencePiece `tokenizer.model`;
  the fixtures carry a byte-level BPE `tokenizer.json`, which every family here writes through
  the converter's own `gpt2` path;
* the BPE pre-tokenizer check: the fixtures' tokenizer hash is unknown to llama.cpp, so it is
  recorded as `default`.

Next to each file it writes `<fixture>.json`: transformers' logits for the fixture's first two
cases, computed on the model *as llama.cpp reads the file*. A GGUF does not carry everything a
`config.json` does, and llama.cpp fills the gaps with its own rules, which rlft's loader
follows too:

* Gemma 2 and 3: no `query_pre_attn_scalar`; scores are scaled by 1/sqrt(head_dim), or by
  1/sqrt(hidden/heads) for the 27B layer counts (46 and 62 layers);
* Gemma 3: no per-layer attention types unless the file has `sliding_window_pattern`;
  every 6th layer is global, the others slide (Gemma 2: every 2nd);
* Qwen3-MoE and Mixtral: the top-k routing weights are always renormalised.

llama.cpp's converter cannot write a Qwen3-MoE model with dense layers (`mlp_only_layers`,
`decoder_sparse_step`), which both Qwen3-MoE fixtures have; the script makes an all-sparse
one (`tiny-qwen3-moe-sparse`, random weights, seed 0) from the first fixture's configuration.

Usage (needs torch, numpy, safetensors, sentencepiece and transformers):

    python3 scripts/families_to_gguf.py --llama-cpp PATH/TO/llama.cpp

`PATH/TO/llama.cpp` is a llama.cpp source tree (for example `vendor/llama.cpp` inside the
llama-cpp-python sdist) holding `convert_hf_to_gguf.py`, `conversion/` and `gguf-py/`.
"""

import argparse
import json
import runpy
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "data" / "fixtures-families"
OUT = ROOT / "tests" / "data" / "fixtures-families-gguf"


def use_llama_cpp(llama_cpp: Path) -> Path:
    """Puts llama.cpp's `conversion` package and gguf-py first on the import path; returns the
    converter script."""
    llama_cpp = llama_cpp.resolve()
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    sys.path.insert(0, str(llama_cpp))
    return llama_cpp / "convert_hf_to_gguf.py"


def convert(converter: Path, checkpoint: Path, out: Path) -> None:
    """Runs llama.cpp's converter on an HF folder, writing an f32 GGUF file."""
    sys.argv = [str(converter), str(checkpoint), "--outtype", "f32", "--outfile", str(out)]
    try:
        runpy.run_path(str(converter), run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise RuntimeError(f"the converter exited with {e.code}") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", required=True, type=Path)
    ap.add_argument("--fixtures", type=Path, default=FIXTURES)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    converter = use_llama_cpp(args.llama_cpp)

    import importlib

    from conversion import base

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"
    for module in ("gemma", "granite", "llama", "olmo", "phi", "qwen"):
        m = importlib.import_module(f"conversion.{module}")
        for cls in vars(m).values():
            if isinstance(cls, type) and issubclass(cls, base.TextModel) and "set_vocab" in cls.__dict__:
                cls.set_vocab = lambda self: self._set_vocab_gpt2()

    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp())
    fixtures = sorted(p for p in args.fixtures.iterdir() if (p / "config.json").is_file())
    fixtures.append(all_sparse_qwen3_moe(args.fixtures / "tiny-qwen3-moe", work))
    for fixture in fixtures:
        out = args.out / f"{fixture.name}.gguf"
        try:
            convert(converter, fixture, out)
        except Exception as e:  # the converter refuses some layouts; say which and go on
            print(f"{fixture.name}: not converted: {type(e).__name__}: {e}", file=sys.stderr)
            out.unlink(missing_ok=True)
            continue
        cases = json.loads((fixture / "expected.json").read_text())["cases"][:2]
        write_reference(fixture, out, cases, args.out / f"{fixture.name}.json")


def all_sparse_qwen3_moe(source: Path, work: Path) -> Path:
    """A Qwen3-MoE checkpoint like `source` with every layer sparse, random weights (seed 0)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = work / "tiny-qwen3-moe-sparse"
    out.mkdir()
    config = AutoConfig.from_pretrained(source)
    config.mlp_only_layers = []
    config.decoder_sparse_step = 1
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    # Wider than the default init, so that logits are of order 1 and the top-k choices and
    # their weights matter (renormalising them or not moves logits by about 0.1).
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.1)
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.5)
    model.save_pretrained(out)
    for f in source.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("chat_template.jinja", "expected.json"):
            shutil.copy(f, out / f.name)
    return out


def llama_cpp_config(fixture: Path, gguf_path: Path):
    """The fixture's transformers configuration as llama.cpp reads the GGUF made from it."""
    import gguf
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(fixture)
    reader = gguf.GGUFReader(str(gguf_path))
    arch = reader.fields["general.architecture"].contents()
    overrides = {}
    if arch in ("gemma2", "gemma3"):
        layers_27b = {"gemma2": 46, "gemma3": 62}[arch]
        if config.num_hidden_layers == layers_27b:
            overrides["query_pre_attn_scalar"] = config.hidden_size // config.num_attention_heads
        else:
            overrides["query_pre_attn_scalar"] = config.head_dim
        field = reader.fields.get(f"{arch}.attention.sliding_window_pattern")
        n = field.contents() if field is not None else {"gemma2": 2, "gemma3": 6}[arch]
        overrides["layer_types"] = [
            "sliding_attention" if i % n < n - 1 else "full_attention"
            for i in range(config.num_hidden_layers)
        ]
    if arch == "qwen3moe":
        overrides["norm_topk_prob"] = True
    for k, v in overrides.items():
        setattr(config, k, v)
    return config, overrides


def write_reference(fixture: Path, gguf_path: Path, cases, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    config, overrides = llama_cpp_config(fixture, gguf_path)
    model = AutoModelForCausalLM.from_pretrained(
        fixture, config=config, attn_implementation="eager", dtype=torch.float32
    )
    model.eval()
    ref = {"source": fixture.name, "overrides": overrides, "cases": []}
    with torch.no_grad():
        for case in cases:
            ids = torch.tensor([case["input_ids"]])
            logits = model(ids).logits[0]
            ref["cases"].append(
                {
                    "input_ids": case["input_ids"],
                    "logits": [[float(f"{x:.7g}") for x in row] for row in logits.tolist()],
                }
            )
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(ref))
    tmp.replace(out)


if __name__ == "__main__":
    main()
