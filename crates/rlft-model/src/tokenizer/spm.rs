//! SentencePiece vocabularies in GGUF files (`tokenizer.ggml.model = "llama"`: pieces, scores and
//! token types, as llama.cpp's converter writes Gemma's, Phi-3's, Mistral's and Llama 2's) as a
//! `tokenizers` BPE, the way transformers converts a SentencePiece BPE model: merges ranked by
//! the score of the piece they make, byte fallback, `▁` for spaces and, with
//! `add_space_prefix`, one in front of the text.

use serde_json::{Map, Value, json};
use std::collections::HashMap;

/// The longest piece whose splits are considered as merges.
const MAX_PIECE_CHARS: usize = 64;

/// The merges SentencePiece's scores imply: every split of a piece into two pieces of the
/// vocabulary, ranked by the piece's score (highest first), ties by the halves' ids, as
/// transformers' `SentencePieceExtractor` ranks them.
fn merges(tokens: &[String], scores: &[f32]) -> Vec<(String, String)> {
    let ids: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut all: Vec<(usize, usize, f32)> = Vec::new();
    // SentencePiece's pieces are short (16 characters by default); a longer one in a file is
    // no merge's result, and splitting it would cost its length squared.
    for (piece, &score) in tokens
        .iter()
        .zip(scores)
        .filter(|(p, _)| p.chars().nth(MAX_PIECE_CHARS).is_none())
    {
        let mut local: Vec<(usize, usize, f32)> = piece
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| {
                let (l, r) = piece.split_at(at);
                Some((*ids.get(l)?, *ids.get(r)?, score))
            })
            .collect();
        local.sort_by_key(|&(l, r, _)| (l, r));
        all.extend(local);
    }
    // Stable: equal scores keep the order above.
    all.sort_by(|a, b| b.2.total_cmp(&a.2));
    all.into_iter()
        .map(|(l, r, _)| (tokens[l].clone(), tokens[r].clone()))
        .collect()
}

/// The `tokenizer.json` parts (`normalizer`, `pre_tokenizer`, `decoder`, `model`) of a
/// SentencePiece vocabulary (`vocab`: `tokens` by id, as a `tokenizer.json` map).
pub(super) fn spec(
    vocab: Map<String, Value>,
    tokens: &[String],
    scores: &[f32],
    unk: Option<&str>,
    add_space_prefix: bool,
) -> Map<String, Value> {
    let merges: Vec<Value> = merges(tokens, scores)
        .into_iter()
        .map(|(l, r)| json!([l, r]))
        .collect();
    let replace = json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"});
    let normalizer = if add_space_prefix {
        json!({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, replace]})
    } else {
        replace
    };
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if add_space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    let mut out = Map::new();
    out.insert("normalizer".into(), normalizer);
    out.insert("pre_tokenizer".into(), Value::Null);
    out.insert(
        "decoder".into(),
        json!({"type": "Sequence", "decoders": decoders}),
    );
    out.insert(
        "model".into(),
        json!({"type": "BPE", "dropout": null, "unk_token": unk,
               "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
               "byte_fallback": true, "ignore_merges": false, "vocab": vocab, "merges": merges}),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_are_ranked_by_the_score_of_the_piece_they_make() {
        let tokens: Vec<String> = ["<unk>", "a", "b", "c", "ab", "bc", "abc"]
            .map(String::from)
            .to_vec();
        // "bc" scores above "ab"; "abc" splits two ways, ranked by the halves' ids.
        let scores = [0.0, -1.0, -2.0, -3.0, -5.0, -4.0, -6.0];
        let m = merges(&tokens, &scores);
        let pair = |l: &str, r: &str| (l.to_string(), r.to_string());
        assert_eq!(
            m,
            vec![
                pair("b", "c"),
                pair("a", "b"),
                pair("a", "bc"),
                pair("ab", "c")
            ]
        );
    }

    #[test]
    fn pieces_split_by_characters_not_bytes() {
        let tokens: Vec<String> = ["é", "▁", "▁é"].map(String::from).to_vec();
        let m = merges(&tokens, &[-1.0, -2.0, -3.0]);
        assert_eq!(m, vec![("▁".to_string(), "é".to_string())]);
    }
}
