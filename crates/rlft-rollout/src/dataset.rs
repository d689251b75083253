//! Prompt datasets: JSONL files (`prompt` or `messages`, `answer`, optional `metadata`), a
//! deterministic per-epoch shuffle, and a cursor that checkpoints save and restore.

use crate::{Result, RolloutError};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rlft_model::{ChatMessage, Tokenizer};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A prompt: plain text or chat messages (rendered with the model's chat template).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Plain text, used as is.
    Text(String),
    /// Chat messages; the generation prompt is added when rendering.
    Messages(Vec<ChatMessage>),
}

impl Prompt {
    /// The text the model sees: plain text as is, messages through the chat template.
    pub fn render(&self, tokenizer: &Tokenizer) -> Result<String> {
        match self {
            Self::Text(t) => Ok(t.clone()),
            Self::Messages(m) => Ok(tokenizer.apply_chat_template(m, true)?),
        }
    }

    /// The text of the last user turn (or the plain text), for logs and rewards.
    pub fn user_text(&self) -> &str {
        match self {
            Self::Text(t) => t,
            Self::Messages(m) => m.last().map_or("", |m| m.content.as_str()),
        }
    }
}

/// One example.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Example {
    /// What the model is asked.
    pub prompt: Prompt,
    /// The reference answer the verifier checks against.
    pub answer: String,
    /// Anything else (task parameters, difficulty, ...).
    #[serde(default)]
    pub metadata: serde_json::Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    prompt: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    answer: serde_json::Value,
    #[serde(default)]
    metadata: serde_json::Value,
}

/// A list of examples.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dataset {
    /// The examples, in file order.
    pub examples: Vec<Example>,
}

impl Dataset {
    /// Reads a JSONL file: one object per line with `prompt` (string) or `messages` (list of
    /// `{role, content}`), `answer` (string or number) and optional `metadata`. Blank lines are
    /// skipped; any other malformed line is an error naming its line number.
    pub fn from_jsonl(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| RolloutError::Dataset {
            path: path.into(),
            line: 0,
            msg: format!("cannot read: {e}"),
        })?;
        let text = std::str::from_utf8(&bytes).map_err(|e| {
            let valid = &bytes[..e.valid_up_to()];
            let start = valid.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            RolloutError::Dataset {
                path: path.into(),
                line: valid.iter().filter(|&&b| b == b'\n').count() + 1,
                msg: format!(
                    "not valid UTF-8 (byte {} of the line); JSONL files are UTF-8 text",
                    e.valid_up_to() - start + 1
                ),
            }
        })?;
        Self::parse_jsonl(text, path)
    }

    /// Parses JSONL text (`path` is only used in errors).
    pub fn parse_jsonl(text: &str, path: &Path) -> Result<Self> {
        let err = |line: usize, msg: String| RolloutError::Dataset {
            path: PathBuf::from(path),
            line,
            msg,
        };
        let mut examples = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            if raw.trim().is_empty() {
                continue;
            }
            let line: Line = serde_json::from_str(raw).map_err(|e| {
                err(
                    n,
                    format!(
                        "{e}; expected an object with \"prompt\" (string) or \"messages\" \
                         (list of {{\"role\", \"content\"}}), \"answer\", and optional \"metadata\""
                    ),
                )
            })?;
            let prompt = match (line.prompt, line.messages) {
                (Some(p), None) => Prompt::Text(p),
                (None, Some(m)) if !m.is_empty() => Prompt::Messages(m),
                (None, Some(_)) => return Err(err(n, "\"messages\" is empty".into())),
                (Some(_), Some(_)) => {
                    return Err(err(n, "give \"prompt\" or \"messages\", not both".into()));
                }
                (None, None) => {
                    return Err(err(n, "missing \"prompt\" or \"messages\"".into()));
                }
            };
            let answer = match line.answer {
                serde_json::Value::String(s) => s,
                serde_json::Value::Number(x) => x.to_string(),
                other => {
                    return Err(err(
                        n,
                        format!("\"answer\" must be a string or a number, got {other}"),
                    ));
                }
            };
            examples.push(Example {
                prompt,
                answer,
                metadata: line.metadata,
            });
        }
        if examples.is_empty() {
            return Err(err(0, "the file has no examples".into()));
        }
        Ok(Self { examples })
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.examples.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.examples.is_empty()
    }
}

/// Position in an endless, epoch-wise shuffled pass over a dataset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataCursor {
    /// Current epoch (0-based).
    pub epoch: u64,
    /// Next position within the epoch's order.
    pub index: usize,
}

/// Hands out examples in a shuffled order that depends only on `(seed, epoch)`.
#[derive(Debug, Clone)]
pub struct DataLoader {
    len: usize,
    seed: u64,
    cursor: DataCursor,
    order: Vec<usize>,
}

impl DataLoader {
    /// A loader over `len` examples, starting at `cursor`.
    pub fn new(len: usize, seed: u64, cursor: DataCursor) -> Result<Self> {
        if len == 0 {
            return Err(RolloutError::Input(
                "cannot iterate over an empty dataset".into(),
            ));
        }
        if cursor.index > len {
            return Err(RolloutError::Input(format!(
                "data cursor index {} is past the dataset's {len} examples (a checkpoint from another dataset?)",
                cursor.index
            )));
        }
        let order = Self::order(len, seed, cursor.epoch);
        Ok(Self {
            len,
            seed,
            cursor,
            order,
        })
    }

    fn order(len: usize, seed: u64, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..len).collect();
        let mix = seed ^ epoch.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        order.shuffle(&mut StdRng::seed_from_u64(mix));
        order
    }

    /// The position to save in a checkpoint.
    pub fn cursor(&self) -> DataCursor {
        self.cursor
    }

    /// The next `n` example indices, moving into the next epoch (reshuffled) when one ends.
    pub fn next_indices(&mut self, n: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            if self.cursor.index == self.len {
                self.cursor = DataCursor {
                    epoch: self.cursor.epoch + 1,
                    index: 0,
                };
                self.order = Self::order(self.len, self.seed, self.cursor.epoch);
            }
            out.push(self.order[self.cursor.index]);
            self.cursor.index += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_lines_report_their_number() {
        let ok = r#"{"prompt": "1+1?", "answer": 2}

{"messages": [{"role": "user", "content": "2+2?"}], "answer": "4", "metadata": {"d": 1}}"#;
        let d = Dataset::parse_jsonl(ok, Path::new("x.jsonl")).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d.examples[0].answer, "2");
        assert_eq!(d.examples[1].prompt.user_text(), "2+2?");
        for (text, line, what) in [
            (
                "{\"prompt\": \"a\", \"answer\": 1}\n{\"prompt\": \"b\"}",
                2,
                "answer",
            ),
            (
                "{\"prompt\": \"a\", \"answer\": 1}\n\n{not json",
                3,
                "expected",
            ),
            ("{\"answer\": 1}", 1, "missing \"prompt\""),
            (
                "{\"prompt\": \"a\", \"answer\": [1]}",
                1,
                "string or a number",
            ),
            (
                "{\"prompt\": \"a\", \"answer\": 1, \"extra\": 2}",
                1,
                "unknown field",
            ),
        ] {
            let e = Dataset::parse_jsonl(text, Path::new("d.jsonl")).unwrap_err();
            match &e {
                RolloutError::Dataset { line: l, msg, .. } => {
                    assert_eq!(*l, line, "{e}");
                    assert!(msg.contains(what), "{e}");
                }
                other => panic!("{other}"),
            }
            assert!(e.to_string().contains(&format!("d.jsonl:{line}")), "{e}");
        }
    }

    #[test]
    fn invalid_utf8_names_its_line() {
        let path = std::env::temp_dir().join(format!("rlft-utf8-{}.jsonl", std::process::id()));
        std::fs::write(
            &path,
            b"{\"prompt\": \"a\", \"answer\": 1}\n{\"prompt\": \"\xff\"}\n",
        )
        .unwrap();
        let e = Dataset::from_jsonl(&path).unwrap_err().to_string();
        std::fs::remove_file(&path).ok();
        assert!(
            e.contains(".jsonl:2: not valid UTF-8 (byte 13 of the line)"),
            "{e}"
        );
    }

    #[test]
    fn shuffle_is_deterministic_and_resumable() {
        let mut a = DataLoader::new(10, 7, DataCursor::default()).unwrap();
        let first: Vec<usize> = a.next_indices(25);
        let mut sorted = first[..10].to_vec();
        sorted.sort();
        assert_eq!(
            sorted,
            (0..10).collect::<Vec<_>>(),
            "an epoch is a permutation"
        );
        assert_ne!(first[..10], first[10..20], "epochs are reshuffled");
        let mut b = DataLoader::new(10, 7, DataCursor::default()).unwrap();
        b.next_indices(13);
        let mut c = DataLoader::new(10, 7, b.cursor()).unwrap();
        assert_eq!(
            c.next_indices(12),
            first[13..25],
            "resuming from a cursor continues the order"
        );
        assert!(
            DataLoader::new(
                10,
                7,
                DataCursor {
                    epoch: 0,
                    index: 11
                }
            )
            .is_err()
        );
    }

    mod fuzz {
        //! Property tests: the JSONL reader returns `Ok` or an error naming a line, never panics.
        use super::*;
        use proptest::prelude::*;
        use serde_json::{Value, json};

        fn config() -> ProptestConfig {
            ProptestConfig {
                cases: 256,
                failure_persistence: None,
                ..ProptestConfig::default()
            }
        }

        /// Any JSON value, a few levels deep, with surprising numbers.
        fn json_value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                any::<f64>().prop_map(Value::from),
                ".{0,8}".prop_map(Value::String),
            ];
            leaf.prop_recursive(3, 16, 4, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    proptest::collection::btree_map(".{0,6}", inner, 0..4)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        /// One line: a valid example, one with fields missing, extra or of the wrong type,
        /// invalid UTF-8, a huge line, JSON nested past serde_json's limit, or blank.
        fn line() -> impl Strategy<Value = Vec<u8>> {
            let field =
                proptest::sample::select(&["prompt", "messages", "answer", "metadata", "x"][..]);
            let message = (
                proptest::option::of(".{0,6}"),
                proptest::option::of(".{0,6}"),
            )
                .prop_map(|(role, content)| {
                    let mut m = serde_json::Map::new();
                    role.map(|r| m.insert("role".into(), r.into()));
                    content.map(|c| m.insert("content".into(), c.into()));
                    Value::Object(m)
                });
            prop_oneof![
                4 => (".{0,12}", any::<i64>())
                    .prop_map(|(p, a)| json!({"prompt": p, "answer": a}).to_string().into_bytes()),
                2 => (proptest::collection::vec(message, 0..3), ".{0,4}")
                    .prop_map(|(m, a)| json!({"messages": m, "answer": a}).to_string().into_bytes()),
                4 => proptest::collection::btree_map(field, json_value(), 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.into(), v)).collect()).to_string().into_bytes()),
                1 => proptest::collection::vec(any::<u8>(), 0..40),
                1 => (0usize..3).prop_map(|k| {
                    format!("{{\"prompt\": \"{}\", \"answer\": 1}}", "x".repeat(100_000 << k)).into_bytes()
                }),
                1 => (100usize..3000).prop_map(|n| {
                    format!("{{\"prompt\": \"p\", \"answer\": 1, \"metadata\": {}{}}}", "[".repeat(n), "]".repeat(n)).into_bytes()
                }),
                1 => Just(b"{\"prompt\": \"p\", \"answer\": \"\xff\"}".to_vec()),
                1 => Just(b"{\"prompt\": \"\\ud800\", \"answer\": 1}".to_vec()),
                1 => proptest::sample::select(&["", " ", "\t", "\u{feff}", "\r"][..]).prop_map(|s| s.as_bytes().to_vec()),
            ]
        }

        proptest! {
            #![proptest_config(config())]

            /// Any text, and any bytes through a file.
            #[test]
            fn any_text_or_bytes(text in ".{0,512}", raw in proptest::collection::vec(any::<u8>(), 0..4096)) {
                let _ = Dataset::parse_jsonl(&text, Path::new("fuzz.jsonl"));
                let dir = std::env::temp_dir().join(format!("rlft-fuzz-jsonl-{}", std::process::id()));
                std::fs::create_dir_all(&dir).unwrap();
                let path = dir.join("bytes.jsonl");
                std::fs::write(&path, &raw).unwrap();
                let _ = Dataset::from_jsonl(&path);
            }

            /// Files of mixed lines: parsed, each non-blank line is one example; or an error
            /// that names the file and a line of it.
            #[test]
            fn mixed_lines(lines in proptest::collection::vec(line(), 0..8), crlf in any::<bool>()) {
                let sep: &[u8] = if crlf { b"\r\n" } else { b"\n" };
                let raw = lines.join(sep);
                let dir = std::env::temp_dir().join(format!("rlft-fuzz-jsonl-lines-{}", std::process::id()));
                std::fs::create_dir_all(&dir).unwrap();
                let path = dir.join("lines.jsonl");
                std::fs::write(&path, &raw).unwrap();
                match Dataset::from_jsonl(&path) {
                    Ok(d) => {
                        let text = std::str::from_utf8(&raw).unwrap();
                        let n = text.lines().filter(|l| !l.trim().is_empty()).count();
                        prop_assert_eq!(d.len(), n);
                    }
                    Err(e @ RolloutError::Dataset { line, .. }) => {
                        prop_assert!(line <= raw.split(|&b| b == b'\n').count(), "{}", e);
                        prop_assert!(e.to_string().contains("lines.jsonl"), "{}", e);
                    }
                    Err(e) => prop_assert!(false, "not a dataset error: {}", e),
                }
            }
        }
    }
}
