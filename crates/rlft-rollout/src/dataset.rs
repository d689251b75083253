//! Datasets: JSONL and Parquet files in TRL's or verl's layout or with columns a recipe names
//! ([`Columns`]), a deterministic per-epoch shuffle, and a cursor that checkpoints save and
//! restore.

mod columns;
mod parquet;

pub use columns::{ANSWER_COLUMNS, COMPLETION_COLUMN, Columns, DataRole, PROMPT_COLUMNS};

use crate::{Result, RolloutError};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rlft_algo::seed::spread;
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
    /// The reference answer the verifier checks against (empty for demonstrations without one).
    pub answer: String,
    /// Further acceptable answers, when the answer column holds a list (the first is
    /// [`Example::answer`]) or verl's `{"target": [...]}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alternatives: Vec<String>,
    /// A demonstration, for the supervised warm-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion: Option<String>,
    /// Every other column of the row (task parameters, `data_source`, `extra_info`, ...).
    #[serde(default)]
    pub metadata: serde_json::Value,
}

impl Example {
    /// Every acceptable answer: [`Example::answer`], then the alternatives.
    pub fn answers(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.answer.as_str()).chain(self.alternatives.iter().map(String::as_str))
    }

    /// The example's `data_source` column, when it has one (per-source evaluation).
    pub fn data_source(&self) -> Option<&str> {
        self.metadata.get("data_source")?.as_str()
    }
}

/// A list of examples.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dataset {
    /// The examples, in file order.
    pub examples: Vec<Example>,
}

impl Dataset {
    /// Reads a JSONL (`.jsonl`, `.json`) or Parquet (`.parquet`) file, mapping each row with
    /// `columns` ([`Columns`]: TRL's and verl's layouts, or the columns a recipe names). Blank
    /// JSONL lines are skipped; any other row that cannot be used is an error naming the file,
    /// the line or row, and the column.
    pub fn load(path: &Path, columns: &Columns, role: DataRole) -> Result<Self> {
        Self::load_checked(path, columns, role, &|_| Ok(()))
    }

    /// As [`Dataset::load`], with `check` run on every example: its error becomes the file's
    /// error at that line or row (a ground truth a reward cannot use, say).
    pub fn load_checked(
        path: &Path,
        columns: &Columns,
        role: DataRole,
        check: &dyn Fn(&Example) -> std::result::Result<(), String>,
    ) -> Result<Self> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("jsonl" | "json" | "ndjson") => {
                let rows = jsonl_rows(&read_utf8(path)?, path)?;
                Self::from_rows(path, rows, columns, role, "line", check)
            }
            Some("parquet" | "pq") => {
                Self::from_rows(path, parquet::rows(path)?, columns, role, "row", check)
            }
            _ => Err(RolloutError::Dataset {
                path: path.into(),
                line: 0,
                msg: "unknown file type: name it .jsonl (one JSON object per line) or .parquet"
                    .into(),
            }),
        }
    }

    /// Reads a JSONL file of RL prompts in any known layout: `prompt` (string or messages) or
    /// `messages`, `answer` (or `solution`, `ground_truth`, `reward_model.ground_truth`),
    /// every other field kept as metadata.
    pub fn from_jsonl(path: &Path) -> Result<Self> {
        Self::parse_jsonl(&read_utf8(path)?, path)
    }

    /// Parses JSONL text of RL prompts (`path` is only used in errors).
    pub fn parse_jsonl(text: &str, path: &Path) -> Result<Self> {
        let rows = jsonl_rows(text, path)?;
        Self::from_rows(
            path,
            rows,
            &Columns::default(),
            DataRole::Prompts,
            "line",
            &|_| Ok(()),
        )
    }

    fn from_rows(
        path: &Path,
        rows: Vec<(usize, serde_json::Map<String, serde_json::Value>)>,
        columns: &Columns,
        role: DataRole,
        unit: &str,
        check: &dyn Fn(&Example) -> std::result::Result<(), String>,
    ) -> Result<Self> {
        let examples = rows
            .into_iter()
            .map(|(n, row)| {
                columns
                    .example(&row, role)
                    .and_then(|ex| check(&ex).map(|()| ex))
                    .map_err(|msg| RolloutError::Dataset {
                        path: path.into(),
                        line: n,
                        msg: if unit == "line" {
                            msg
                        } else {
                            format!("{unit} {n}: {msg}")
                        },
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        if examples.is_empty() {
            return Err(RolloutError::Dataset {
                path: path.into(),
                line: 0,
                msg: "the file has no examples".into(),
            });
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

    /// Checks that message prompts can be rendered: a model without a chat template cannot
    /// take them.
    pub fn check_renderable(&self, tokenizer: &Tokenizer, path: &Path) -> Result<()> {
        if tokenizer.chat_template.is_some() {
            return Ok(());
        }
        match self
            .examples
            .iter()
            .position(|e| matches!(e.prompt, Prompt::Messages(_)))
        {
            Some(i) => Err(RolloutError::Dataset {
                path: path.into(),
                line: i + 1,
                msg: "the prompt is a list of chat messages but the model has no chat template; \
                      use a chat model (its tokenizer_config.json or GGUF carries the template) or \
                      plain-text prompts"
                    .into(),
            }),
            None => Ok(()),
        }
    }
}

/// A file's text; invalid UTF-8 is an error naming the line.
fn read_utf8(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| RolloutError::Dataset {
        path: path.into(),
        line: 0,
        msg: format!("cannot read: {e}"),
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let e = e.utf8_error();
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
    })
}

/// The JSON objects of JSONL text with their line numbers; blank lines are skipped.
fn jsonl_rows(
    text: &str,
    path: &Path,
) -> Result<Vec<(usize, serde_json::Map<String, serde_json::Value>)>> {
    let mut rows = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let err = |msg: String| RolloutError::Dataset {
            path: PathBuf::from(path),
            line: i + 1,
            msg,
        };
        match serde_json::from_str(raw) {
            Ok(serde_json::Value::Object(m)) => rows.push((i + 1, m)),
            Ok(other) => {
                return Err(err(format!(
                    "expected a JSON object with a prompt and an answer, got {}",
                    truncate(&other.to_string(), 60)
                )));
            }
            Err(e) => {
                return Err(err(format!(
                    "{e}; expected one JSON object per line, with \"prompt\" (string or list \
                     of {{\"role\", \"content\"}}) and \"answer\""
                )));
            }
        }
    }
    Ok(rows)
}

fn truncate(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
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
        let mix = seed ^ spread(epoch.wrapping_add(1));
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
            ("{\"answer\": 1}", 1, "no prompt"),
            (
                "{\"prompt\": \"a\", \"answer\": [[1]]}",
                1,
                "item 0 of the list is a list",
            ),
            ("[1, 2]", 1, "expected a JSON object"),
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
