#!/usr/bin/env python3
"""Makes the SentencePiece GGUF fixture: a tiny Llama whose vocabulary is a SentencePiece BPE
model (byte fallback, a dummy prefix), converted by llama.cpp's own `convert_hf_to_gguf.py`,
which writes it as `tokenizer.ggml.model = llama` with scores and token types (the form of
Gemma's, Phi-3's, Mistral's and Llama 2's published GGUF files).

Writes `tests/data/spm-gguf/tiny-llama-spm.gguf` and `tokens.json`: texts, the ids SentencePiece
itself gives them and its decoding of those ids, which rlft's GGUF tokenizer must reproduce.

    python3 scripts/spm_gguf_fixture.py --llama-cpp PATH/TO/llama.cpp

Needs sentencepiece, torch and transformers; PATH/TO/llama.cpp as in families_to_gguf.py.
"""

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from families_to_gguf import convert, use_llama_cpp

ROOT = Path(__file__).resolve().parent.parent
# The training text: the fixtures' corpus and the documentation, enough for merges whose order
# matters (a wrong ranking of them changes the ids). The documentation changes, so a later run
# trains another vocabulary: any run's output is a valid fixture, checked the same way.
CORPUS = [ROOT / "tests" / "data" / "fixtures" / "corpus.txt", *sorted((ROOT / "docs").glob("*.md"))]
OUT = ROOT / "tests" / "data" / "spm-gguf"

TEXTS = [
    "Hello world",
    "What is 12 + 30? The answer is 42.",
    "  two leading spaces and a trailing one ",
    "line one\nline two\n\n",
    "naïve café — déjà vu, 東京 and emoji 🙂",
    "tabs\tand\tnumbers 3.14159 2718281828",
    "a<0x41>b is text, not a byte token",
    "",
    "x",
    "The learner recomputes log-probabilities; importance ratios correct stale samples.",
    "rollout.max_new_tokens = 64 and algorithm.kl_coef = 0.001 in recipes/quickstart.toml",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", required=True, type=Path)
    args = ap.parse_args()
    import sentencepiece as spm
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    work = Path(tempfile.mkdtemp())
    corpus = work / "corpus.txt"
    corpus.write_text("\n".join(p.read_text() for p in CORPUS))
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(work / "tokenizer"),
        vocab_size=1500,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        add_dummy_prefix=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        seed_sentencepiece_size=100000,
    )
    sp = spm.SentencePieceProcessor(model_file=str(work / "tokenizer.model"))
    ckpt = work / "tiny-llama-spm"
    ckpt.mkdir()
    config = LlamaConfig(
        vocab_size=sp.get_piece_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(ckpt)
    shutil.copy(work / "tokenizer.model", ckpt / "tokenizer.model")

    OUT.mkdir(parents=True, exist_ok=True)
    convert(use_llama_cpp(args.llama_cpp), ckpt, OUT / "tiny-llama-spm.gguf")
    cases = [
        {"text": t, "ids": sp.encode(t), "decoded": sp.decode(sp.encode(t))} for t in TEXTS
    ]
    tmp = OUT / "tokens.json.tmp"
    tmp.write_text(json.dumps({"cases": cases}, ensure_ascii=False, indent=1))
    tmp.replace(OUT / "tokens.json")


if __name__ == "__main__":
    main()
