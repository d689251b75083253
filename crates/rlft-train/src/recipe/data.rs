//! `[data]` (your own train, eval and warm-up files), `[[reward]]` (the reward terms that score
//! them) and `[[tool]]` (the tools the model may call), with their checks.

use crate::{Result, TrainError};
use rlft_rollout::{AnswerFormat, Columns, Gsm8kMethod, Scorer};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Your own data: JSONL or Parquet files in TRL's or verl's layout.
#[derive(schemars::JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataSection {
    /// RL prompts with answers (replaces the task generator's).
    pub train: Option<PathBuf>,
    /// Evaluation problems with answers (every row is evaluated).
    pub eval: Option<PathBuf>,
    /// Demonstrations (prompt and completion) for the supervised warm-up (`[sft]`).
    pub sft: Option<PathBuf>,
    /// The prompt column (default: `prompt`, else `messages`).
    pub prompt_column: Option<String>,
    /// The answer column, dotted for a struct field (default: `reward_model.ground_truth`,
    /// `answer`, `solution`, `ground_truth`, the first present).
    pub answer_column: Option<String>,
    /// The completion column of the warm-up file (default `completion`).
    pub completion_column: Option<String>,
}

impl DataSection {
    /// The column mapping for [`rlft_rollout::Dataset::load`].
    pub fn columns(&self) -> Columns {
        Columns {
            prompt: self.prompt_column.clone(),
            answer: self.answer_column.clone(),
            completion: self.completion_column.clone(),
        }
    }
}

/// A reward term's kind.
#[derive(schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardKind {
    /// verl's GSM8K scorer (`method = "strict" | "flexible"`): 1 or 0.
    Gsm8k,
    /// verl's Hendrycks-MATH scorer on the last `\boxed{}`: 1 or 0.
    MathBoxed,
    /// verl's DAPO scorer ("Answer:" with Minerva normalisation, boxed fallback): 1 or −1.
    MathDapo,
    /// verl's Search-R1 exact match on `<answer>…</answer>`: 1 or 0.
    QaEm,
    /// The answer found by `format` equals the ground truth (numerically when both are
    /// numbers): 1 or 0.
    Exact,
    /// The completion matches `pattern`: 1 or 0.
    Regex,
    /// The completion has `format`'s markup: 1 or 0.
    Format,
    /// `−coef · max(0, len − target) / target`.
    Length,
    /// DAPO's soft overlong punishment over the last `cache_len` tokens before `max_len`.
    Overlong,
    /// An external program (`command`), one JSON object per line in, one number per line out.
    Command,
    /// verl's default reward: the scorer picked per row by its `data_source` (`openai/gsm8k`
    /// → gsm8k, `lighteval/MATH` → math_boxed, `math_dapo`/`aime*` → math_dapo, `searchR1_*` →
    /// qa_em), with `sources` for your own names. Own data without `[[reward]]` terms is
    /// scored by it.
    BySource,
}

impl RewardKind {
    /// Whether the kind compares the completion with the ground truth (so it can define
    /// accuracy by default).
    pub fn is_verifiable(self) -> bool {
        matches!(
            self,
            Self::Gsm8k
                | Self::MathBoxed
                | Self::MathDapo
                | Self::QaEm
                | Self::Exact
                | Self::BySource
        )
    }

    /// The name used when the term gives none.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gsm8k => "gsm8k",
            Self::MathBoxed => "math_boxed",
            Self::MathDapo => "math_dapo",
            Self::QaEm => "qa_em",
            Self::Exact => "exact",
            Self::Regex => "regex",
            Self::Format => "format",
            Self::Length => "length",
            Self::Overlong => "overlong",
            Self::Command => "command",
            Self::BySource => "by_source",
        }
    }
}

/// One `[[reward]]` term: `kind`, `weight`, an optional `name`, and the options of its kind.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardTerm {
    /// What scores the sample.
    pub kind: RewardKind,
    /// Its weight in the total (default 1).
    #[serde(default = "one")]
    pub weight: f64,
    /// Metric name (`reward/<name>`); default the kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// This term defines `accuracy`, `eval/accuracy` and pass@k (a score > 0 is correct);
    /// default: the first verifiable term.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correctness: Option<bool>,
    /// `gsm8k`: `strict` (default) or `flexible`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<Gsm8kMethod>,
    /// `exact` (default `last_number`) and `format` (default `answer_tag`): where the answer is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<AnswerFormat>,
    /// `regex`: the pattern (Rust `regex` syntax).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// `length`: tokens with no penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<usize>,
    /// `length`: penalty per `target` extra tokens (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coef: Option<f64>,
    /// `overlong`: the length limit (default `rollout.max_new_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_len: Option<usize>,
    /// `overlong`: the ramp's length before `max_len`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_len: Option<usize>,
    /// `overlong`: the penalty at `max_len` (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
    /// `command`: the program and its arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// `command`: seconds per sample before the process is killed (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// `by_source`: your own `data_source` names and the scorer of each (`gsm8k_strict`,
    /// `gsm8k_flexible`, `math_boxed`, `math_dapo`, `qa_em`), before verl's table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<BTreeMap<String, Scorer>>,
}

fn one() -> f64 {
    1.0
}

/// Metric names the trainer writes under `reward/` itself.
const RESERVED: [&str; 5] = ["mean", "std", "failed", "timeouts", "total"];

impl RewardTerm {
    /// A term of `kind` with weight 1 and no options.
    pub fn new(kind: RewardKind) -> Self {
        Self {
            kind,
            weight: 1.0,
            name: None,
            correctness: None,
            method: None,
            format: None,
            pattern: None,
            target: None,
            coef: None,
            max_len: None,
            cache_len: None,
            factor: None,
            command: None,
            timeout_s: None,
            sources: None,
        }
    }

    /// The metric name.
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(self.kind.as_str())
    }

    /// The options this term sets, by key.
    fn options(&self) -> [(&'static str, bool); 11] {
        [
            ("method", self.method.is_some()),
            ("format", self.format.is_some()),
            ("pattern", self.pattern.is_some()),
            ("target", self.target.is_some()),
            ("coef", self.coef.is_some()),
            ("max_len", self.max_len.is_some()),
            ("cache_len", self.cache_len.is_some()),
            ("factor", self.factor.is_some()),
            ("command", self.command.is_some()),
            ("timeout_s", self.timeout_s.is_some()),
            ("sources", self.sources.is_some()),
        ]
    }

    /// `(allowed options, required options)` of the kind.
    fn schema(kind: RewardKind) -> (&'static [&'static str], &'static [&'static str]) {
        match kind {
            RewardKind::Gsm8k => (&["method"], &[]),
            RewardKind::MathBoxed | RewardKind::MathDapo | RewardKind::QaEm => (&[], &[]),
            RewardKind::Exact | RewardKind::Format => (&["format"], &[]),
            RewardKind::Regex => (&["pattern"], &["pattern"]),
            RewardKind::Length => (&["target", "coef"], &["target"]),
            RewardKind::Overlong => (&["max_len", "cache_len", "factor"], &["cache_len"]),
            RewardKind::Command => (&["command", "timeout_s"], &["command"]),
            RewardKind::BySource => (&["sources"], &[]),
        }
    }

    fn check(&self, key: &str) -> Result<()> {
        let bad = |msg: String| Err(TrainError::Recipe(format!("{key}: {msg}")));
        let kind = self.kind.as_str();
        let (allowed, required) = Self::schema(self.kind);
        for (opt, set) in self.options() {
            if set && !allowed.contains(&opt) {
                let also = if allowed.is_empty() {
                    "it takes no options".to_string()
                } else {
                    format!("its options: {}", allowed.join(", "))
                };
                return bad(format!(
                    "`{opt}` is not an option of kind = \"{kind}\" ({also})"
                ));
            }
            if !set && required.contains(&opt) {
                return bad(format!("kind = \"{kind}\" needs `{opt}`"));
            }
        }
        if !self.weight.is_finite() {
            return bad(format!("weight must be finite, got {}", self.weight));
        }
        let name = self.name();
        let name_ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
        if !name_ok {
            return bad(format!(
                "name {name:?}: use letters, digits, `_`, `-` or `.` (it becomes reward/{name})"
            ));
        }
        if RESERVED.contains(&name) {
            return bad(format!(
                "name {name:?} is taken by the trainer's reward/{name} metric; choose another"
            ));
        }
        if let Some(p) = &self.pattern
            && let Err(e) = regex::Regex::new(p)
        {
            return bad(format!(
                "pattern {p:?} is not a valid regular expression: {e}"
            ));
        }
        if self.target == Some(0) {
            return bad("target must be at least 1 token".into());
        }
        for (k, v) in [("coef", self.coef), ("factor", self.factor)] {
            if let Some(v) = v
                && !(v.is_finite() && v >= 0.0)
            {
                return bad(format!("{k} must be finite and >= 0, got {v}"));
            }
        }
        if let Some(c) = &self.command
            && c.first().is_none_or(|p| p.trim().is_empty())
        {
            return bad(
                "command must name a program: command = [\"python3\", \"score.py\"]".into(),
            );
        }
        if let Some(t) = self.timeout_s
            && !(t.is_finite() && t > 0.0 && t <= 3600.0)
        {
            return bad(format!("timeout_s must be in (0, 3600] seconds, got {t}"));
        }
        if let Some(m) = &self.sources
            && m.keys().any(|k| k.trim().is_empty())
        {
            return bad("sources: a data_source name is empty".into());
        }
        Ok(())
    }
}

/// A tool's kind.
#[derive(schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// The bounded arithmetic evaluator (`+ - * /`, parentheses); default name `calc`.
    Calculator,
    /// An external program per call: a JSON object in, text out.
    Command,
}

/// One `[[tool]]`: the model calls it as `<tool>name(arguments)</tool>` and sees the result as
/// an observation (outside the loss).
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// What runs the call.
    pub kind: ToolKind,
    /// The name the model calls (default `calc` for the calculator; required for commands).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `command`: the program and its arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// Seconds per call before it fails (default 10 for commands, 2 for the calculator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// Longest output in bytes (default 512).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<usize>,
}

impl ToolSpec {
    /// The name the model calls.
    pub fn name(&self) -> &str {
        match (&self.name, self.kind) {
            (Some(n), _) => n,
            (None, ToolKind::Calculator) => "calc",
            (None, ToolKind::Command) => "",
        }
    }

    fn check(&self, key: &str) -> Result<()> {
        let bad = |msg: String| Err(TrainError::Recipe(format!("{key}: {msg}")));
        let name = self.name();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return bad(format!(
                "name {name:?}: a tool needs a name of letters, digits and `_` (the model \
                 writes <tool>name(arguments)</tool>)"
            ));
        }
        match (self.kind, &self.command) {
            (ToolKind::Calculator, Some(_)) => {
                return bad("`command` is not an option of kind = \"calculator\"".into());
            }
            (ToolKind::Command, None) => return bad("kind = \"command\" needs `command`".into()),
            (ToolKind::Command, Some(c)) if c.first().is_none_or(|p| p.trim().is_empty()) => {
                return bad(
                    "command must name a program: command = [\"python3\", \"tool.py\"]".into(),
                );
            }
            _ => {}
        }
        if let Some(t) = self.timeout_s
            && !(t.is_finite() && t > 0.0 && t <= 3600.0)
        {
            return bad(format!("timeout_s must be in (0, 3600] seconds, got {t}"));
        }
        if let Some(b) = self.max_output_bytes
            && !(1..=1 << 20).contains(&b)
        {
            return bad(format!("max_output_bytes must be in 1..=1048576, got {b}"));
        }
        Ok(())
    }
}

/// Checks the `[[tool]]` list: each tool's options and unique names.
pub(super) fn check_tools(tools: &[ToolSpec]) -> Result<()> {
    let mut names: Vec<&str> = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let key = format!("tool[{i}] ({})", t.name());
        t.check(&key)?;
        if names.contains(&t.name()) {
            return Err(TrainError::Recipe(format!(
                "{key}: another tool is named {:?}: give each a different `name`",
                t.name()
            )));
        }
        names.push(t.name());
    }
    Ok(())
}

/// Checks `[data]` and `[[reward]]` together: each term's options, unique names, one
/// correctness term.
pub(super) fn check(data: &DataSection, terms: &[RewardTerm], max_new_tokens: usize) -> Result<()> {
    let bad = |key: &str, msg: String| Err(TrainError::Recipe(format!("{key}: {msg}")));
    for (key, col) in [
        ("data.prompt_column", &data.prompt_column),
        ("data.answer_column", &data.answer_column),
        ("data.completion_column", &data.completion_column),
    ] {
        if col.as_deref().is_some_and(|c| c.trim().is_empty()) {
            return bad(key, "must name a column (or leave it out)".into());
        }
    }
    for (key, path) in [
        ("data.train", &data.train),
        ("data.eval", &data.eval),
        ("data.sft", &data.sft),
    ] {
        if path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            return bad(key, "must be a file path (or leave it out)".into());
        }
    }
    let mut names: Vec<&str> = Vec::new();
    for (i, t) in terms.iter().enumerate() {
        let key = format!("reward[{i}] ({})", t.name());
        t.check(&key)?;
        if names.contains(&t.name()) {
            return bad(
                &key,
                format!(
                    "another term is named {:?}: give each a different `name`",
                    t.name()
                ),
            );
        }
        names.push(t.name());
        if t.kind == RewardKind::Overlong {
            let max_len = t.max_len.unwrap_or(max_new_tokens);
            let cache = t.cache_len.unwrap_or(0);
            if cache == 0 || cache > max_len {
                return bad(
                    &key,
                    format!("cache_len must be in 1..={max_len} (max_len), got {cache}"),
                );
            }
        }
    }
    match terms.iter().filter(|t| t.correctness == Some(true)).count() {
        0 | 1 => {}
        n => {
            return bad(
                "reward",
                format!(
                    "{n} terms set correctness = true; mark only the one that defines accuracy"
                ),
            );
        }
    }
    if !terms.is_empty() && correctness_term(terms).is_none() {
        return bad(
            "reward",
            "no term defines accuracy: mark one with correctness = true (a score > 0 counts as \
             correct)"
                .into(),
        );
    }
    Ok(())
}

/// The reward terms a run scores with: the recipe's, or for own data without any, verl's
/// default (`by_source`: the scorer named by each row's `data_source`).
pub fn effective_terms(data: &DataSection, terms: &[RewardTerm]) -> Vec<RewardTerm> {
    if terms.is_empty() && data.train.is_some() {
        vec![RewardTerm::new(RewardKind::BySource)]
    } else {
        terms.to_vec()
    }
}

/// The index of the term that defines accuracy: the one marked `correctness = true`, else the
/// first verifiable one not marked `false`.
pub fn correctness_term(terms: &[RewardTerm]) -> Option<usize> {
    terms
        .iter()
        .position(|t| t.correctness == Some(true))
        .or_else(|| {
            terms
                .iter()
                .position(|t| t.kind.is_verifiable() && t.correctness != Some(false))
        })
}
