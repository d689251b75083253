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
        let text = std::fs::read_to_string(path).map_err(|e| RolloutError::Dataset {
            path: path.into(),
            line: 0,
            msg: format!("cannot read: {e}"),
        })?;
        Self::parse_jsonl(&text, path)
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
}
