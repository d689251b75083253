//! Tokenizers: a Hugging Face `tokenizer.json` through the `tokenizers` crate, or the vocabulary
//! embedded in a GGUF file converted into the same kind of tokenizer, plus the special-token ids
//! and the chat template that come with it.

use crate::chat::{ChatMessage, ChatTemplate};
use crate::families::{BYTE_LEVEL_BPE, SENTENCEPIECE, gguf_pre_tokenizer, pre_tokenizer_names};
use crate::gguf::{GgufFile, GgufValue};
use crate::{ModelError, Result};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

mod spm;

/// A tokenizer with its special tokens and chat template.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Beginning-of-sequence token id.
    pub bos_id: Option<u32>,
    /// End-of-sequence token ids (generation stops at any of them). The first is the canonical
    /// one written on export.
    pub eos_ids: Vec<u32>,
    /// Padding token id.
    pub pad_id: Option<u32>,
    /// Chat template, if the checkpoint has one.
    pub chat_template: Option<ChatTemplate>,
    /// The longest vocabulary entry in bytes, computed on first use.
    longest_token: std::sync::OnceLock<usize>,
}

fn tok_err(path: &Path, msg: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer {
        path: path.into(),
        msg: msg.to_string(),
    }
}

/// A special token in `tokenizer_config.json`: a string or an AddedToken object.
fn token_content(v: &Value) -> Option<&str> {
    v.as_str()
        .or_else(|| v.get("content").and_then(Value::as_str))
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.into(),
        source,
    })?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| tok_err(path, format!("not valid JSON: {e}")))
}

impl Tokenizer {
    /// Loads `tokenizer.json` from an HF checkpoint folder, the special tokens from
    /// `tokenizer_config.json` (and `generation_config.json`'s `eos_token_id`), and the chat
    /// template from `chat_template.jinja` or `tokenizer_config.json`.
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(tok_err(
                &path,
                "not found; an HF checkpoint needs tokenizer.json (the fast-tokenizer file)",
            ));
        }
        let inner = tokenizers::Tokenizer::from_file(&path).map_err(|e| tok_err(&path, e))?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = read_json(&cfg_path)?.unwrap_or(Value::Null);
        let id_of = |key: &str| -> Result<Option<u32>> {
            match cfg.get(key).filter(|v| !v.is_null()) {
                None => Ok(None),
                Some(v) => {
                    let content = token_content(v)
                        .ok_or_else(|| tok_err(&cfg_path, format!("'{key}' is not a token")))?;
                    inner.token_to_id(content).map(Some).ok_or_else(|| {
                        tok_err(
                            &cfg_path,
                            format!("{key} '{content}' is not in the vocabulary of tokenizer.json"),
                        )
                    })
                }
            }
        };
        let bos_id = id_of("bos_token")?;
        let mut eos_ids: Vec<u32> = id_of("eos_token")?.into_iter().collect();
        let pad_id = id_of("pad_token")?;
        if let Some(generation) = read_json(&dir.join("generation_config.json"))? {
            let extra: Vec<u32> = match generation.get("eos_token_id") {
                Some(Value::Number(n)) => n.as_u64().into_iter().map(|v| v as u32).collect(),
                Some(Value::Array(a)) => a
                    .iter()
                    .filter_map(Value::as_u64)
                    .map(|v| v as u32)
                    .collect(),
                _ => vec![],
            };
            for id in extra {
                if !eos_ids.contains(&id) {
                    eos_ids.push(id);
                }
            }
        }
        let jinja = dir.join("chat_template.jinja");
        let template_src = if jinja.exists() {
            Some(
                std::fs::read_to_string(&jinja).map_err(|source| ModelError::Io {
                    path: jinja.clone(),
                    source,
                })?,
            )
        } else {
            match cfg.get("chat_template") {
                Some(Value::String(s)) => Some(s.clone()),
                // A list of named templates: take "default".
                Some(Value::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template").and_then(Value::as_str))
                    .map(str::to_string),
                _ => None,
            }
        };
        let chat_template = template_src.as_deref().map(ChatTemplate::new).transpose()?;
        Ok(Self {
            inner,
            bos_id,
            eos_ids,
            pad_id,
            chat_template,
            longest_token: Default::default(),
        })
    }

    /// Converts the tokenizer embedded in a GGUF file into a `tokenizers` tokenizer that encodes
    /// as llama.cpp does: byte-level BPE (`tokenizer.ggml.model = "gpt2"`: vocab, merges and
    /// token types, honouring `tokenizer.ggml.pre`) or SentencePiece (`"llama"`: pieces, scores
    /// and token types, ranked into merges as transformers does). Special-token ids come from
    /// the GGUF metadata (`tokenizer.ggml.{bos,eos,padding}_token_id`).
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let path = file.path();
        let model = file
            .require("tokenizer.ggml.model")?
            .as_str()
            .unwrap_or_default();
        if model != BYTE_LEVEL_BPE && model != SENTENCEPIECE {
            return Err(tok_err(
                path,
                format!(
                    "tokenizer.ggml.model = '{model}': rlft converts byte-level BPE \
                     ('{BYTE_LEVEL_BPE}') and SentencePiece ('{SENTENCEPIECE}') GGUF \
                     tokenizers; load the HF checkpoint with its tokenizer.json instead"
                ),
            ));
        }
        let tokens = gguf_strings(file, "tokenizer.ggml.tokens")?;
        let vocab: serde_json::Map<String, Value> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), json!(i)))
            .collect();
        let types: Vec<i64> = match file.get("tokenizer.ggml.token_type") {
            Some(GgufValue::Array(a)) => a
                .iter()
                .map(|v| match v {
                    GgufValue::I64(i) => *i,
                    GgufValue::U64(u) => *u as i64,
                    _ => 1,
                })
                .collect(),
            _ => vec![1; tokens.len()],
        };
        // llama.cpp token types: 3 = control, 4 = user-defined; both are matched verbatim in
        // text before BPE (control ones are "special").
        let added: Vec<Value> = tokens
            .iter()
            .zip(&types)
            .enumerate()
            .filter(|(_, (_, ty))| **ty == 3 || **ty == 4)
            .map(|(id, (content, ty))| {
                json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": *ty == 4, "special": *ty == 3})
            })
            .collect();
        let mut spec = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "post_processor": null,
        });
        let parts = if model == SENTENCEPIECE {
            sentencepiece(file, vocab, &tokens, &types)?
        } else {
            byte_level_bpe(file, vocab)?
        };
        if let Value::Object(m) = &mut spec {
            m.extend(parts);
        }
        let inner = spec
            .to_string()
            .parse::<tokenizers::Tokenizer>()
            .map_err(|e| tok_err(path, format!("cannot build the tokenizer: {e}")))?;
        let id = |key: &str| -> Result<Option<u32>> {
            match file.get(key) {
                None => Ok(None),
                Some(v) => {
                    let id = v
                        .as_u64()
                        .filter(|&i| (i as usize) < tokens.len())
                        .ok_or_else(|| tok_err(path, format!("'{key}' is not a token id")))?;
                    Ok(Some(id as u32))
                }
            }
        };
        let chat_template = file
            .get("tokenizer.chat_template")
            .and_then(GgufValue::as_str)
            .map(ChatTemplate::new)
            .transpose()?;
        Ok(Self {
            inner,
            bos_id: id("tokenizer.ggml.bos_token_id")?,
            eos_ids: id("tokenizer.ggml.eos_token_id")?.into_iter().collect(),
            pad_id: id("tokenizer.ggml.padding_token_id")?,
            chat_template,
            longest_token: Default::default(),
        })
    }

    /// A byte-level tokenizer with no merges (one token per UTF-8 byte, ids 0–255) plus the
    /// special tokens `<|endoftext|>` (256, EOS and padding), `<|im_start|>` (257) and
    /// `<|im_end|>` (258), and a ChatML template: for models trained from scratch, needing no
    /// file.
    pub fn byte_level() -> Self {
        // GPT-2's byte → printable character table.
        let mut printable: Vec<u32> = (u32::from('!')..=u32::from('~'))
            .chain(u32::from('¡')..=u32::from('¬'))
            .chain(u32::from('®')..=u32::from('ÿ'))
            .collect();
        let mut chars = printable.clone();
        let mut n = 0;
        for b in 0..256u32 {
            if !printable.contains(&b) {
                printable.push(b);
                chars.push(256 + n);
                n += 1;
            }
        }
        let mut vocab = serde_json::Map::new();
        for (b, c) in printable.iter().zip(&chars) {
            let ch = char::from_u32(*c).expect("valid code point");
            vocab.insert(ch.to_string(), json!(b));
        }
        let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
        let added: Vec<Value> = specials
            .iter()
            .enumerate()
            .map(|(i, t)| {
                json!({"id": 256 + i, "content": t, "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        let spec = json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "ignore_merges": false, "vocab": vocab, "merges": []},
        });
        let inner = spec
            .to_string()
            .parse::<tokenizers::Tokenizer>()
            .expect("the byte-level spec is valid");
        let template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
                        {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        Self {
            inner,
            bos_id: None,
            eos_ids: vec![256],
            pad_id: Some(256),
            chat_template: Some(ChatTemplate::new(template).expect("valid template")),
            longest_token: Default::default(),
        }
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The id that pads a batch: the pad token, else the first end-of-sequence token, else 0.
    pub fn padding_id(&self) -> u32 {
        self.pad_id.or(self.eos_ids.first().copied()).unwrap_or(0)
    }

    /// The longest vocabulary entry in bytes, added tokens included (at least 1). Entries are
    /// written as the tokenizer stores them (GPT-2's byte characters, SentencePiece's `▁`,
    /// `<0x0A>`), never shorter than the text they stand for, so a text longer than `n` times
    /// this needs more than `n` tokens: a prompt can be judged too long without tokenising it.
    pub fn max_token_bytes(&self) -> usize {
        *self.longest_token.get_or_init(|| {
            self.inner
                .get_vocab(true)
                .keys()
                .map(String::len)
                .max()
                .unwrap_or(1)
                .max(1)
        })
    }

    /// Whether a text of `bytes` bytes surely tokenises to more than `tokens` tokens (longer
    /// than `tokens` × [`Tokenizer::max_token_bytes`]): such a text can be refused or skipped
    /// without being tokenised, which costs far more memory than the text.
    pub fn surely_longer_than(&self, bytes: usize, tokens: usize) -> bool {
        bytes > tokens.saturating_mul(self.max_token_bytes())
    }

    /// Number of token ids (vocabulary plus added tokens).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Encodes `text` without adding special tokens; special tokens written in the text
    /// (e.g. `<|im_start|>`) are recognised.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| ModelError::Input(format!("cannot encode text: {e}")))
    }

    /// Decodes ids to text (`skip_special` drops control tokens).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| ModelError::Input(format!("cannot decode ids: {e}")))
    }

    /// Incremental decoder for streaming output: feed ids one at a time.
    pub fn decode_stream(&self, skip_special: bool) -> TokenStream<'_> {
        TokenStream(self.inner.decode_stream(skip_special))
    }

    /// The text of one token id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of one token.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Renders a chat prompt with the checkpoint's template.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let t = self.chat_template.as_ref().ok_or_else(|| {
            ModelError::Template(
                "this checkpoint has no chat template (chat_template.jinja, tokenizer_config.json or \
                 GGUF tokenizer.chat_template); pass plain text instead"
                    .into(),
            )
        })?;
        let bos = self.bos_id.and_then(|i| self.id_to_token(i));
        let eos = self.eos_ids.first().and_then(|&i| self.id_to_token(i));
        t.render(
            messages,
            add_generation_prompt,
            bos.as_deref(),
            eos.as_deref(),
        )
    }

    /// Writes `tokenizer.json`, `tokenizer_config.json` and (if any) `chat_template.jinja` into
    /// `dir`, as transformers and vLLM read them.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let io = |path: PathBuf| move |source| ModelError::Io { path, source };
        let path = dir.join("tokenizer.json");
        let text = self
            .inner
            .to_string(false)
            .map_err(|e| tok_err(&path, format!("cannot write: {e}")))?;
        crate::write_atomic(&path, text.as_bytes()).map_err(io(path.clone()))?;
        let name = |id: Option<u32>| id.and_then(|i| self.id_to_token(i));
        let cfg = json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": name(self.bos_id),
            "eos_token": name(self.eos_ids.first().copied()),
            "pad_token": name(self.pad_id),
            "unk_token": null,
            "clean_up_tokenization_spaces": false,
            "add_bos_token": false,
            "model_max_length": 1_000_000_000_000_000_000u64,
        });
        let cfg_path = dir.join("tokenizer_config.json");
        let text = serde_json::to_string_pretty(&cfg).expect("JSON values serialise");
        crate::write_atomic(&cfg_path, text.as_bytes()).map_err(io(cfg_path.clone()))?;
        if let Some(t) = &self.chat_template {
            let p = dir.join("chat_template.jinja");
            crate::write_atomic(&p, t.source().as_bytes()).map_err(io(p.clone()))?;
        }
        Ok(())
    }
}

/// Streaming decoder returned by [`Tokenizer::decode_stream`].
pub struct TokenStream<'a>(
    tokenizers::DecodeStream<
        'a,
        tokenizers::ModelWrapper,
        tokenizers::NormalizerWrapper,
        tokenizers::PreTokenizerWrapper,
        tokenizers::PostProcessorWrapper,
        tokenizers::DecoderWrapper,
    >,
);

impl TokenStream<'_> {
    /// Adds one id; returns the text it completes, if any (multi-byte characters may need
    /// several ids).
    pub fn step(&mut self, id: u32) -> Result<Option<String>> {
        self.0
            .step(id)
            .map_err(|e| ModelError::Input(format!("cannot decode id {id}: {e}")))
    }
}

/// The GGUF metadata array `key`, which must hold strings.
fn gguf_strings(file: &GgufFile, key: &str) -> Result<Vec<String>> {
    file.require(key)?
        .as_array()
        .and_then(|a| a.iter().map(|v| v.as_str().map(str::to_string)).collect())
        .ok_or_else(|| tok_err(file.path(), format!("'{key}' is not an array of strings")))
}

/// The `tokenizer.json` parts of a SentencePiece vocabulary (`tokenizer.ggml.model =
/// "llama"`): its pieces ranked by score into merges ([`spm::spec`]), the unknown token (type
/// 2) and whether a space is put before the text.
fn sentencepiece(
    file: &GgufFile,
    vocab: serde_json::Map<String, Value>,
    tokens: &[String],
    types: &[i64],
) -> Result<serde_json::Map<String, Value>> {
    let path = file.path();
    let scores: Vec<f32> = match file.get("tokenizer.ggml.scores") {
        Some(GgufValue::Array(a)) if a.len() == tokens.len() => a
            .iter()
            .map(|v| v.as_f64().map(|x| x as f32))
            .collect::<Option<_>>()
            .ok_or_else(|| tok_err(path, "'tokenizer.ggml.scores' holds a non-number"))?,
        _ => {
            return Err(tok_err(
                path,
                "a SentencePiece vocabulary needs 'tokenizer.ggml.scores', one per token",
            ));
        }
    };
    // llama.cpp: token type 2 is the unknown token.
    let unk = tokens
        .iter()
        .zip(types)
        .find(|(_, ty)| **ty == 2)
        .map(|(t, _)| t.as_str());
    let prefix = file
        .get("tokenizer.ggml.add_space_prefix")
        .and_then(GgufValue::as_bool)
        .unwrap_or(true);
    Ok(spm::spec(vocab, tokens, &scores, unk, prefix))
}

/// The `tokenizer.json` parts of a byte-level BPE vocabulary (`tokenizer.ggml.model = "gpt2"`):
/// its merges and the pre-tokenizer `tokenizer.ggml.pre` names.
fn byte_level_bpe(
    file: &GgufFile,
    vocab: serde_json::Map<String, Value>,
) -> Result<serde_json::Map<String, Value>> {
    let path = file.path();
    let merges = gguf_strings(file, "tokenizer.ggml.merges")?;
    let pre = file
        .get("tokenizer.ggml.pre")
        .and_then(GgufValue::as_str)
        .unwrap_or("default");
    let pre_tokenizer = gguf_pre_tokenizer(pre).ok_or_else(|| {
        tok_err(
            path,
            format!(
                "tokenizer.ggml.pre = '{pre}' is not supported (supported: {}); load the HF \
                 checkpoint with its tokenizer.json instead",
                pre_tokenizer_names()
            ),
        )
    })?;
    let parts = json!({
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": merges},
    });
    let Value::Object(m) = parts else {
        return Err(tok_err(
            path,
            "the byte-level BPE parts are not a JSON object",
        ));
    };
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_round_trips_any_text() {
        let t = Tokenizer::byte_level();
        assert_eq!(t.vocab_size(), 259);
        for text in [
            "What is 12 + 7? Answer with the number.",
            "héllo ✓ 42\n",
            "<|im_end|>x",
        ] {
            let ids = t.encode(text).unwrap();
            assert_eq!(t.decode(&ids, false).unwrap(), text);
        }
        assert_eq!(t.encode("ab").unwrap(), vec![97, 98]);
        assert_eq!(t.encode("<|im_end|>").unwrap(), vec![258]);
        let chat = t
            .apply_chat_template(&[ChatMessage::user("hi")], true)
            .unwrap();
        assert_eq!(
            chat,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }
}
