//! Rewards: answer extraction, exact numeric match, format and length terms, DAPO's overlong
//! shaping, and weighted sums of them, each evaluated under a timeout. A reward that errors,
//! times out or returns NaN marks the sample failed (counted, excluded from the loss); it never
//! crashes the run.

use rlft_algo::shaping::OverlongPenalty;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// What a reward function sees of one sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RewardInput {
    /// The prompt text.
    pub prompt: String,
    /// The model's completion (all assistant turns; tool observations included for multi-turn).
    pub completion: String,
    /// The reference answer.
    pub answer: String,
    /// Dataset metadata.
    pub metadata: serde_json::Value,
    /// Generated tokens (observation tokens excluded).
    pub response_len: usize,
    /// Cut off by the length limit.
    pub truncated: bool,
}

/// A reward function. Implement it to add your own; `Err` marks the sample failed.
pub trait Reward: Send + Sync {
    /// Name used in metrics (`reward/<name>`).
    fn name(&self) -> &str;
    /// The score of one sample.
    fn score(&self, input: &RewardInput) -> Result<f64, String>;
}

/// Where the final answer is in a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerFormat {
    /// The last number in the text.
    LastNumber,
    /// The content of the last `\boxed{…}` (nested braces allowed).
    Boxed,
    /// The content of the last `<answer>…</answer>`.
    AnswerTag,
}

fn number_regex() -> &'static regex::Regex {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| regex::Regex::new(r"-?\d[\d,]*(?:\.\d+)?").expect("valid regex"))
}

impl AnswerFormat {
    /// The extracted answer, trimmed, if present.
    pub fn extract(self, text: &str) -> Option<String> {
        match self {
            Self::LastNumber => number_regex()
                .find_iter(text)
                .last()
                .map(|m| m.as_str().trim_end_matches(',').to_string()),
            Self::AnswerTag => {
                let start = text.rfind("<answer>")? + "<answer>".len();
                let end = text[start..].find("</answer>")? + start;
                Some(text[start..end].trim().to_string())
            }
            Self::Boxed => {
                let start = text.rfind("\\boxed{")? + "\\boxed{".len();
                let mut depth = 1;
                for (i, c) in text[start..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                return Some(text[start..start + i].trim().to_string());
                            }
                        }
                        _ => {}
                    }
                }
                None
            }
        }
    }
}

/// Parses a number written as `1,234`, `-5`, `3.50` or `\frac`-free LaTeX like `{42}`.
pub fn parse_number(s: &str) -> Option<f64> {
    let s = s
        .trim()
        .trim_matches(|c| c == '{' || c == '}' || c == '$')
        .replace(',', "");
    s.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// 1 when the extracted answer equals the reference numerically (within `tolerance`), else 0.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ExactMatch {
    /// Where the answer is.
    pub format: AnswerFormat,
    /// Absolute tolerance.
    pub tolerance: f64,
}

impl ExactMatch {
    /// Exact match on the answer found by `format`.
    pub fn new(format: AnswerFormat) -> Self {
        Self {
            format,
            tolerance: 1e-6,
        }
    }
    /// Whether `completion` answers `answer`.
    pub fn is_correct(&self, completion: &str, answer: &str) -> bool {
        let (Some(got), Some(want)) = (
            self.format
                .extract(completion)
                .as_deref()
                .and_then(parse_number),
            parse_number(answer),
        ) else {
            return false;
        };
        (got - want).abs() <= self.tolerance
    }
}

impl Reward for ExactMatch {
    fn name(&self) -> &str {
        "correct"
    }
    fn score(&self, x: &RewardInput) -> Result<f64, String> {
        Ok(f64::from(u8::from(
            self.is_correct(&x.completion, &x.answer),
        )))
    }
}

/// 1 when the completion contains the answer format's markup (`<answer>…</answer>` or
/// `\boxed{…}`; a number for `LastNumber`), else 0.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FormatReward(pub AnswerFormat);

impl Reward for FormatReward {
    fn name(&self) -> &str {
        "format"
    }
    fn score(&self, x: &RewardInput) -> Result<f64, String> {
        Ok(f64::from(u8::from(self.0.extract(&x.completion).is_some())))
    }
}

/// `−coef · max(0, len − target) / target`: discourages responses longer than `target` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LengthPenalty {
    /// Length with no penalty.
    pub target: usize,
    /// Penalty per `target` extra tokens.
    pub coef: f64,
}

impl Reward for LengthPenalty {
    fn name(&self) -> &str {
        "length_penalty"
    }
    fn score(&self, x: &RewardInput) -> Result<f64, String> {
        let over = x.response_len.saturating_sub(self.target) as f64;
        Ok(-self.coef * over / self.target.max(1) as f64)
    }
}

/// DAPO's soft overlong punishment as a reward term.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OverlongShaping(pub OverlongPenalty);

impl Reward for OverlongShaping {
    fn name(&self) -> &str {
        "overlong"
    }
    fn score(&self, x: &RewardInput) -> Result<f64, String> {
        Ok(self.0.penalty(x.response_len))
    }
}

/// The result of scoring one sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RewardOutcome {
    /// Weighted total and each term `(name, unweighted value)`.
    Scored {
        /// Σ weight · value.
        total: f64,
        /// Per-term values.
        terms: Vec<(String, f64)>,
    },
    /// A term errored, timed out or was not finite.
    Failed(String),
}

impl RewardOutcome {
    /// The total, if scored.
    pub fn total(&self) -> Option<f64> {
        match self {
            Self::Scored { total, .. } => Some(*total),
            Self::Failed(_) => None,
        }
    }
}

/// Several rewards combined with weights, evaluated with a per-sample timeout.
#[derive(Clone)]
pub struct RewardSet {
    terms: Vec<(f64, Arc<dyn Reward>)>,
    /// Longest a sample's scoring may take.
    pub timeout: Duration,
}

impl std::fmt::Debug for RewardSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<(f64, &str)> = self.terms.iter().map(|(w, r)| (*w, r.name())).collect();
        f.debug_struct("RewardSet")
            .field("terms", &names)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Default for RewardSet {
    fn default() -> Self {
        Self {
            terms: Vec::new(),
            timeout: Duration::from_secs(5),
        }
    }
}

impl RewardSet {
    /// An empty set with a 5 s timeout.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `reward` with `weight`.
    pub fn with(mut self, weight: f64, reward: impl Reward + 'static) -> Self {
        self.terms.push((weight, Arc::new(reward)));
        self
    }

    /// Adds a shared reward with `weight`.
    pub fn with_arc(mut self, weight: f64, reward: Arc<dyn Reward>) -> Self {
        self.terms.push((weight, reward));
        self
    }

    /// Sets the per-sample timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Names of the terms.
    pub fn names(&self) -> Vec<String> {
        self.terms
            .iter()
            .map(|(_, r)| r.name().to_string())
            .collect()
    }

    /// Scores every sample, each on its own thread under the timeout (a stuck reward function is
    /// abandoned, not waited for).
    pub fn score(&self, inputs: Vec<RewardInput>) -> Vec<RewardOutcome> {
        let receivers: Vec<_> = inputs
            .into_iter()
            .map(|input| {
                let terms = self.terms.clone();
                crate::spawn_guarded(move || score_one(&terms, &input))
            })
            .collect();
        let deadline = std::time::Instant::now() + self.timeout;
        receivers
            .into_iter()
            .map(|rx| {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                match rx.recv_timeout(left) {
                    Ok(Some(outcome)) => outcome,
                    Ok(None) => RewardOutcome::Failed("reward function panicked".into()),
                    Err(_) => {
                        RewardOutcome::Failed(format!("reward timed out after {:?}", self.timeout))
                    }
                }
            })
            .collect()
    }
}

fn score_one(terms: &[(f64, Arc<dyn Reward>)], input: &RewardInput) -> RewardOutcome {
    let mut total = 0.0;
    let mut values = Vec::with_capacity(terms.len());
    for (w, r) in terms {
        match r.score(input) {
            Ok(v) if v.is_finite() => {
                total += w * v;
                values.push((r.name().to_string(), v));
            }
            Ok(v) => return RewardOutcome::Failed(format!("reward '{}' returned {v}", r.name())),
            Err(e) => return RewardOutcome::Failed(format!("reward '{}' failed: {e}", r.name())),
        }
    }
    RewardOutcome::Scored {
        total,
        terms: values,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extraction() {
        use AnswerFormat::*;
        assert_eq!(
            LastNumber.extract("3 apples and 1,250 pears.").as_deref(),
            Some("1,250")
        );
        assert_eq!(LastNumber.extract("x = -4.5").as_deref(), Some("-4.5"));
        assert_eq!(LastNumber.extract("none"), None);
        assert_eq!(
            Boxed.extract(r"so \boxed{\frac{1}{2}} ok").as_deref(),
            Some(r"\frac{1}{2}")
        );
        assert_eq!(
            Boxed.extract(r"\boxed{1} then \boxed{42}").as_deref(),
            Some("42")
        );
        assert_eq!(Boxed.extract(r"\boxed{unclosed"), None);
        assert_eq!(
            AnswerTag.extract("<answer> 56 </answer>").as_deref(),
            Some("56")
        );
        assert_eq!(AnswerTag.extract("<answer>56"), None);
        let m = ExactMatch::new(AnswerTag);
        assert!(m.is_correct("think... <answer>1,000</answer>", "1000"));
        assert!(!m.is_correct("<answer>999</answer>", "1000"));
        assert!(!m.is_correct("1000", "1000"));
    }

    struct Slow;
    impl Reward for Slow {
        fn name(&self) -> &str {
            "slow"
        }
        fn score(&self, _: &RewardInput) -> Result<f64, String> {
            std::thread::sleep(Duration::from_secs(2));
            Ok(1.0)
        }
    }
    struct Nan;
    impl Reward for Nan {
        fn name(&self) -> &str {
            "nan"
        }
        fn score(&self, x: &RewardInput) -> Result<f64, String> {
            match x.completion.as_str() {
                "panic" => panic!("boom"),
                "err" => Err("bad".into()),
                _ => Ok(f64::NAN),
            }
        }
    }

    #[test]
    fn weighted_sum_and_failures() {
        let input = |c: &str| RewardInput {
            completion: c.into(),
            answer: "7".into(),
            response_len: 30,
            ..Default::default()
        };
        let set = RewardSet::new()
            .with(1.0, ExactMatch::new(AnswerFormat::LastNumber))
            .with(0.5, FormatReward(AnswerFormat::AnswerTag))
            .with(
                1.0,
                LengthPenalty {
                    target: 20,
                    coef: 0.2,
                },
            );
        let out = set.score(vec![input("<answer>7</answer>"), input("8")]);
        assert!((out[0].total().unwrap() - (1.0 + 0.5 - 0.1)).abs() < 1e-12);
        assert!((out[1].total().unwrap() - (-0.1)).abs() < 1e-12);

        let bad = RewardSet::new().with(1.0, Nan);
        let out = bad.score(vec![input("x"), input("err"), input("panic")]);
        assert!(out.iter().all(|o| o.total().is_none()), "{out:?}");

        let slow = RewardSet::new()
            .with(1.0, Slow)
            .with_timeout(Duration::from_millis(100));
        let t = std::time::Instant::now();
        let out = slow.score(vec![input("x")]);
        assert!(matches!(&out[0], RewardOutcome::Failed(m) if m.contains("timed out")));
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
