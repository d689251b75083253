//! llama.cpp's names for tokenizers: the vocabulary kinds of `tokenizer.ggml.model` and the
//! pre-tokenizers of `tokenizer.ggml.pre`, which llama.cpp names after the model families
//! that brought them, with the `tokenizers` pre-tokenizer each one is.

use serde_json::{Value, json};

/// `tokenizer.ggml.model` of a byte-level BPE vocabulary.
pub(crate) const BYTE_LEVEL_BPE: &str = "gpt2";

/// `tokenizer.ggml.model` of a SentencePiece vocabulary (pieces and scores).
pub(crate) const SENTENCEPIECE: &str = "llama";

/// The `tokenizer.ggml.pre` names rlft writes, one per pre-tokenizer it can express
/// ([`gguf_pre_tokenizer`] reads these and some aliases).
pub(crate) const GGUF_PRES: [&str; 4] = ["gpt-2", "smollm", "llama-bpe", "qwen2"];

/// llama.cpp pre-tokenizer regexes (`llama-vocab.cpp`) that are a single `Split` in HF terms.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// llama.cpp's regexes for `tokenizer.ggml.pre = "default"` (`llama-vocab.cpp`), applied in
/// turn before byte-level BPE. Not GPT-2's: punctuation runs and digit triples split first.
const LLAMA_CPP_DEFAULT_REGEXES: [&str; 4] = [
    r"[\p{P}\$\+<=>\^~\|]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
];

/// The `tokenizer.ggml.pre` names [`gguf_pre_tokenizer`] reads, for error messages.
pub(crate) fn pre_tokenizer_names() -> String {
    std::iter::once("default")
        .chain(GGUF_PRES)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `tokenizers` pre-tokenizer (JSON) llama.cpp applies for a GGUF's `tokenizer.ggml.pre`,
/// or `None` for a name rlft does not convert.
pub(crate) fn gguf_pre_tokenizer(pre: &str) -> Option<Value> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |pattern: &str| json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
    Some(match pre {
        "gpt2" | "gpt-2" => byte_level(true),
        "default" => {
            let mut steps: Vec<Value> =
                LLAMA_CPP_DEFAULT_REGEXES.iter().map(|r| split(r)).collect();
            steps.push(byte_level(false));
            json!({"type": "Sequence", "pretokenizers": steps})
        }
        "smollm" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
        "llama3" | "llama-v3" | "llama-bpe" | "smaug-bpe" => {
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_REGEX), byte_level(false)]})
        }
        "qwen2" | "deepseek-r1-qwen" => {
            json!({"type": "Sequence", "pretokenizers": [split(QWEN2_REGEX), byte_level(false)]})
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pieces `pre` splits `text` into, as llama.cpp's pre-tokenizer of that name does.
    fn pieces(pre: &str, text: &str) -> Vec<String> {
        use tokenizers::{PreTokenizedString, PreTokenizer, pre_tokenizers::PreTokenizerWrapper};
        let p: PreTokenizerWrapper =
            serde_json::from_value(gguf_pre_tokenizer(pre).unwrap()).unwrap();
        let mut s = PreTokenizedString::from(text);
        p.pre_tokenize(&mut s).unwrap();
        s.get_splits(
            tokenizers::OffsetReferential::Original,
            tokenizers::OffsetType::Byte,
        )
        .into_iter()
        .map(|(piece, _, _)| piece.to_string())
        .collect()
    }

    #[test]
    fn gguf_pre_tokenizers_split_as_llama_cpp() {
        // llama.cpp's default: punctuation runs, GPT-2's pattern, digit runs, digit triples.
        assert_eq!(
            pieces("default", "Hello, world!! 12345"),
            ["Hello", ",", "Ġworld", "!!", "Ġ", "123", "45"]
        );
        assert_eq!(
            pieces("gpt-2", "Hello, world!! 12345"),
            ["Hello", ",", "Ġworld", "!!", "Ġ12345"]
        );
        assert_eq!(pieces("smollm", "x  12"), ["x", "ĠĠ", "1", "2"]);
        assert_eq!(pieces("qwen2", "ab 123"), ["ab", "Ġ", "1", "2", "3"]);
        assert_eq!(pieces("llama-bpe", "ab 12345"), ["ab", "Ġ", "123", "45"]);
        assert_eq!(
            pre_tokenizer_names(),
            "default, gpt-2, smollm, llama-bpe, qwen2"
        );
    }
}
