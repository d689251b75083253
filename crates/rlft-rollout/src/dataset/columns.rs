//! Which column of a row is the prompt, the answer and the completion: TRL's layout (`prompt` as
//! a string or chat messages, `answer` or `solution`, `completion`), verl's (`prompt` messages,
//! `reward_model.ground_truth`, `data_source`, `extra_info`), rlft's older one (`messages`,
//! `answer`), or the columns a recipe names. Every other column is kept as metadata.

use super::{Example, Prompt};
use rlft_model::ChatMessage;
use serde_json::{Map, Value};

/// Prompt columns tried in order when none is named.
pub const PROMPT_COLUMNS: [&str; 2] = ["prompt", "messages"];
/// Answer columns tried in order when none is named (dotted: a field of a struct column).
pub const ANSWER_COLUMNS: [&str; 4] = [
    "reward_model.ground_truth",
    "answer",
    "solution",
    "ground_truth",
];
/// The completion column when none is named.
pub const COMPLETION_COLUMN: &str = "completion";

/// What a file is for, which decides the columns it must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataRole {
    /// RL prompts or evaluation problems: a prompt and an answer.
    Prompts,
    /// Supervised warm-up: a prompt and a completion (the answer is optional).
    Demonstrations,
}

/// Column names chosen by a recipe (`data.prompt_column`, …); `None` tries the known layouts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Columns {
    /// The prompt: a string or a list of `{role, content}` messages.
    pub prompt: Option<String>,
    /// The answer (ground truth), a dotted path for a field of a struct column
    /// (`reward_model.ground_truth`); a string, a number, a list of them (any is accepted) or
    /// verl's `{"target": [...]}`.
    pub answer: Option<String>,
    /// The demonstration for supervised warm-up: a string or assistant messages.
    pub completion: Option<String>,
}

/// Looks up a dotted path (`reward_model.ground_truth`) in a row; a null is absent.
fn lookup<'a>(row: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let mut v = row.get(parts.next()?)?;
    for p in parts {
        v = v.as_object()?.get(p)?;
    }
    (!v.is_null()).then_some(v)
}

/// The acceptable answers in an answer cell: a string or a number; a non-empty list of them
/// (any is accepted); or verl's Search-R1 `{"target": ...}` holding either.
fn ground_truth(v: &Value) -> Result<(String, Vec<String>), String> {
    const EXPECTED: &str = "the answer must be a string, a number, a list of them or \
                            {\"target\": ...}";
    let one = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(x) => Some(x.to_string()),
        _ => None,
    };
    match v {
        Value::Object(m) if m.contains_key("target") => match &m["target"] {
            Value::Object(_) => Err(format!("{EXPECTED}; \"target\" holds an object")),
            t => ground_truth(t),
        },
        Value::Array(items) => {
            let mut all = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                all.push(one(item).ok_or_else(|| {
                    format!("{EXPECTED}; item {i} of the list is {}", type_name(item))
                })?);
            }
            if all.is_empty() {
                return Err(format!("{EXPECTED}; got an empty list"));
            }
            let first = all.remove(0);
            Ok((first, all))
        }
        other => one(other)
            .map(|a| (a, Vec::new()))
            .ok_or_else(|| format!("{EXPECTED}, got {}", type_name(other))),
    }
}

/// A JSON type's name, for errors.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn messages(v: &Value, column: &str) -> Result<Vec<ChatMessage>, String> {
    let Value::Array(items) = v else {
        unreachable!("called on lists only")
    };
    if items.is_empty() {
        return Err(format!("column \"{column}\": the message list is empty"));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let field = |k: &str| match m.get(k) {
                Some(Value::String(s)) => Ok(s.clone()),
                Some(other) => Err(format!(
                    "column \"{column}\", message {i}: \"{k}\" must be a string, got {}",
                    type_name(other)
                )),
                None => Err(format!(
                    "column \"{column}\", message {i}: expected {{\"role\", \"content\"}}, got {m}"
                )),
            };
            Ok(ChatMessage {
                role: field("role")?,
                content: field("content")?,
            })
        })
        .collect()
}

/// A row's answer as [`Columns::example`] reads it.
struct Answer<'a> {
    /// The column it came from; `Err` with the column looked for (empty: the default names)
    /// where the row has none.
    column: Result<&'a str, &'a str>,
    /// The ground truth (empty for a demonstration without one).
    truth: String,
    /// Other acceptable answers.
    alternatives: Vec<String>,
}

/// What a row's columns are, for messages.
fn columns_of(row: &Map<String, Value>) -> String {
    let names: Vec<&str> = row.keys().map(String::as_str).collect();
    format!("the row has columns: {}", names.join(", "))
}

impl Columns {
    /// The example in `row`, or what is wrong with it (naming the column).
    pub fn example(&self, row: &Map<String, Value>, role: DataRole) -> Result<Example, String> {
        let (prompt_col, prompt) = self.prompt(row)?;
        let Answer {
            column: answer_col,
            truth: answer,
            alternatives,
        } = self.answer(row, role)?;
        let (completion_col, completion) = self.completion(row, role)?;
        // Everything else is metadata.
        let used = [
            Some(prompt_col),
            answer_col.ok(),
            completion.is_some().then_some(completion_col),
        ];
        let top = |c: &str| c.split('.').next().unwrap_or(c).to_string();
        let used: Vec<String> = used.into_iter().flatten().map(top).collect();
        let metadata: Map<String, Value> = row
            .iter()
            .filter(|(k, _)| !used.contains(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Ok(Example {
            prompt,
            answer,
            alternatives,
            completion,
            metadata: Value::Object(metadata),
        })
    }

    /// The prompt's column and the prompt: `data.prompt_column`, else the one of "prompt" and
    /// "messages" the row has.
    fn prompt<'a>(&'a self, row: &Map<String, Value>) -> Result<(&'a str, Prompt), String> {
        let columns = || columns_of(row);
        let prompt_col = match &self.prompt {
            Some(c) => {
                if lookup(row, c).is_none() {
                    return Err(format!(
                        "no column \"{c}\" (data.prompt_column); {}",
                        columns()
                    ));
                }
                c.as_str()
            }
            None => {
                let found: Vec<&str> = PROMPT_COLUMNS
                    .into_iter()
                    .filter(|c| lookup(row, c).is_some())
                    .collect();
                match found[..] {
                    [c] => c,
                    [] => {
                        return Err(format!(
                            "no prompt: looked for columns \"prompt\" and \"messages\"; {} (name \
                             the column with data.prompt_column)",
                            columns()
                        ));
                    }
                    _ => return Err("give \"prompt\" or \"messages\", not both".into()),
                }
            }
        };
        let prompt = match lookup(row, prompt_col) {
            Some(Value::String(s)) if s.trim().is_empty() => {
                return Err(format!("column \"{prompt_col}\": the prompt is empty"));
            }
            Some(Value::String(s)) => Prompt::Text(s.clone()),
            Some(v @ Value::Array(_)) => Prompt::Messages(messages(v, prompt_col)?),
            Some(other) => {
                return Err(format!(
                    "column \"{prompt_col}\": expected a string or a list of {{\"role\", \
                     \"content\"}} messages, got {}",
                    type_name(other)
                ));
            }
            None => unreachable!("checked above"),
        };
        Ok((prompt_col, prompt))
    }

    /// The answer's column (`Err` with the column looked for, empty for the default names,
    /// where the row has none), the ground truth and its alternatives. Demonstrations need no
    /// answer.
    fn answer<'a>(
        &'a self,
        row: &Map<String, Value>,
        role: DataRole,
    ) -> Result<Answer<'a>, String> {
        let columns = || columns_of(row);
        let answer_col = match &self.answer {
            Some(c) => lookup(row, c).map(|_| c.as_str()).ok_or(c.as_str()),
            None => ANSWER_COLUMNS
                .into_iter()
                .find(|c| lookup(row, c).is_some())
                .ok_or(""),
        };
        let (answer, alternatives) = match (answer_col, role) {
            (Ok(c), _) => match lookup(row, c) {
                Some(v) => ground_truth(v).map_err(|e| format!("column \"{c}\": {e}"))?,
                None => unreachable!("found above"),
            },
            (Err(_), DataRole::Demonstrations) => (String::new(), Vec::new()),
            (Err(""), DataRole::Prompts) => {
                return Err(format!(
                    "no answer: looked for columns {}; {} (name the column with \
                     data.answer_column)",
                    ANSWER_COLUMNS.map(|c| format!("\"{c}\"")).join(", "),
                    columns()
                ));
            }
            (Err(c), DataRole::Prompts) => {
                return Err(format!(
                    "no column \"{c}\" (data.answer_column); {}",
                    columns()
                ));
            }
        };
        Ok(Answer {
            column: answer_col,
            truth: answer,
            alternatives,
        })
    }

    /// The completion's column and the completion (required of demonstrations), a string or
    /// messages joined.
    fn completion<'a>(
        &'a self,
        row: &Map<String, Value>,
        role: DataRole,
    ) -> Result<(&'a str, Option<String>), String> {
        let columns = || columns_of(row);
        let completion_col = self.completion.as_deref().unwrap_or(COMPLETION_COLUMN);
        let completion = match lookup(row, completion_col) {
            None if role == DataRole::Demonstrations => {
                return Err(format!(
                    "no column \"{completion_col}\" (the demonstration for the warm-up; name it \
                     with data.completion_column); {}",
                    columns()
                ));
            }
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(v @ Value::Array(_)) => Some(
                messages(v, completion_col)?
                    .into_iter()
                    .map(|m| m.content)
                    .collect::<Vec<_>>()
                    .join(""),
            ),
            Some(other) => {
                return Err(format!(
                    "column \"{completion_col}\": expected a string or a list of messages, got {}",
                    type_name(other)
                ));
            }
        };
        Ok((completion_col, completion))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn verl_layout() {
        let r = row(json!({
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": "2+2?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "4"},
            "extra_info": {"index": 7, "split": "train"}
        }));
        let ex = Columns::default().example(&r, DataRole::Prompts).unwrap();
        assert_eq!(ex.answer, "4");
        assert_eq!(ex.prompt.user_text(), "2+2?");
        assert_eq!(ex.metadata["data_source"], "openai/gsm8k");
        assert_eq!(ex.metadata["extra_info"]["index"], 7);
        assert!(ex.metadata.get("reward_model").is_none());
        assert!(ex.metadata.get("prompt").is_none());
    }

    #[test]
    fn trl_layout_and_named_columns() {
        let r = row(json!({"prompt": "Q", "solution": 12, "id": "a"}));
        let ex = Columns::default().example(&r, DataRole::Prompts).unwrap();
        assert_eq!(
            (ex.answer.as_str(), ex.metadata["id"].as_str()),
            ("12", Some("a"))
        );
        let r = row(json!({"question": "Q", "target": {"value": "x"}, "completion": "c"}));
        let cols = Columns {
            prompt: Some("question".into()),
            answer: Some("target.value".into()),
            completion: None,
        };
        let ex = cols.example(&r, DataRole::Demonstrations).unwrap();
        assert_eq!(ex.answer, "x");
        assert_eq!(ex.completion.as_deref(), Some("c"));
        assert_eq!(ex.metadata, json!({}));
        let r = row(json!({"prompt": "Q", "completion": [{"role": "assistant", "content": "A"}]}));
        let ex = Columns::default()
            .example(&r, DataRole::Demonstrations)
            .unwrap();
        assert_eq!(
            (ex.answer.as_str(), ex.completion.as_deref()),
            ("", Some("A"))
        );
    }

    #[test]
    fn list_and_target_ground_truths_give_alternatives() {
        let d = Columns::default();
        for (v, first, rest) in [
            (
                json!(["Paris", "paris, france", 3]),
                "Paris",
                vec!["paris, france", "3"],
            ),
            (json!({"target": ["a", "b"]}), "a", vec!["b"]),
            (json!({"target": "a"}), "a", vec![]),
            (json!([7]), "7", vec![]),
        ] {
            let r = row(json!({"prompt": "Q", "reward_model": {"ground_truth": v.clone()}}));
            let ex = d.example(&r, DataRole::Prompts).unwrap();
            assert_eq!(ex.answer, first, "{v}");
            assert_eq!(ex.alternatives, rest, "{v}");
            let all: Vec<&str> = ex.answers().collect();
            assert_eq!(all.len(), 1 + rest.len());
        }
    }

    #[test]
    fn errors_name_the_column() {
        let d = Columns::default();
        for (r, role, want) in [
            (json!({"answer": 1}), DataRole::Prompts, "no prompt"),
            (json!({"prompt": "a"}), DataRole::Prompts, "no answer"),
            (
                json!({"prompt": 3, "answer": 1}),
                DataRole::Prompts,
                "column \"prompt\"",
            ),
            (
                json!({"prompt": "a", "answer": []}),
                DataRole::Prompts,
                "column \"answer\": the answer must be a string, a number, a list of them or \
                 {\"target\": ...}; got an empty list",
            ),
            (
                json!({"prompt": "a", "answer": ["x", {"y": 1}]}),
                DataRole::Prompts,
                "item 1 of the list is an object",
            ),
            (
                json!({"prompt": "a", "answer": {"y": 1}}),
                DataRole::Prompts,
                "got an object",
            ),
            (
                json!({"prompt": "a", "answer": true}),
                DataRole::Prompts,
                "got a boolean",
            ),
            (
                json!({"prompt": " ", "answer": 1}),
                DataRole::Prompts,
                "empty",
            ),
            (
                json!({"prompt": [], "answer": 1}),
                DataRole::Prompts,
                "empty",
            ),
            (
                json!({"prompt": [{"role": "user"}], "answer": 1}),
                DataRole::Prompts,
                "message 0",
            ),
            (
                json!({"prompt": "a"}),
                DataRole::Demonstrations,
                "no column \"completion\"",
            ),
            (
                json!({"prompt": "a", "messages": [], "answer": 1}),
                DataRole::Prompts,
                "not both",
            ),
        ] {
            let e = d.example(&row(r.clone()), role).unwrap_err();
            assert!(e.contains(want), "{r}: {e}");
        }
        let named = Columns {
            answer: Some("reward_model.ground_truth".into()),
            ..Columns::default()
        };
        let e = named
            .example(&row(json!({"prompt": "a", "answer": 1})), DataRole::Prompts)
            .unwrap_err();
        assert!(
            e.contains("data.answer_column") && e.contains("columns: answer, prompt"),
            "{e}"
        );
    }
}
