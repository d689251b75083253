//! Reward terms: answer extraction, exact match, format, regex and length terms, DAPO's
//! overlong shaping, and [`Named`] to give any term the name a recipe chose.

use super::{Reward, RewardInput};
use rlft_algo::shaping::OverlongPenalty;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Where the final answer is in a completion.
#[derive(schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Whether `completion` answers `answer`: numerically (within the tolerance) when both are
    /// numbers, else as text with surrounding whitespace and inner runs of it ignored.
    pub fn is_correct(&self, completion: &str, answer: &str) -> bool {
        let Some(got) = self.format.extract(completion) else {
            return false;
        };
        match (parse_number(&got), parse_number(answer)) {
            (Some(g), Some(w)) => (g - w).abs() <= self.tolerance,
            (None, None) => {
                let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
                !answer.trim().is_empty() && words(&got) == words(answer)
            }
            _ => false,
        }
    }
}

impl Reward for ExactMatch {
    fn name(&self) -> &str {
        "correct"
    }
    fn score(&self, x: &RewardInput) -> Result<f64, String> {
        let any = x
            .answers()
            .iter()
            .any(|a| self.is_correct(&x.completion, a));
        Ok(f64::from(u8::from(any)))
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

impl LengthPenalty {
    /// `coef` per `target` tokens past `target`.
    pub fn new(target: usize, coef: f64) -> Self {
        Self { target, coef }
    }
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

/// 1 when the completion matches a regular expression (anywhere), else 0: TRL's format rewards.
#[derive(Debug, Clone)]
pub struct RegexMatch(pub regex::Regex);

impl Reward for RegexMatch {
    fn name(&self) -> &str {
        "regex"
    }
    fn score(&self, x: &RewardInput) -> Result<f64, String> {
        Ok(f64::from(u8::from(self.0.is_match(&x.completion))))
    }
}

/// Any reward under another name (`reward/<name>` in the metrics).
#[derive(Clone)]
pub struct Named {
    /// The name.
    pub name: String,
    /// The reward.
    pub inner: Arc<dyn Reward>,
}

impl Reward for Named {
    fn name(&self) -> &str {
        &self.name
    }
    fn score(&self, x: &RewardInput) -> Result<f64, String> {
        self.inner.score(x)
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
        assert!(m.is_correct("<answer> New  York </answer>", "New York"));
        assert!(!m.is_correct("<answer>York</answer>", "New York"));
        assert!(!m.is_correct("<answer>12</answer>", "twelve"));
        assert!(!m.is_correct("<answer></answer>", " "));
        let r = RegexMatch(regex::Regex::new(r"^<think>.*</think>").unwrap());
        let input = |c: &str| RewardInput {
            completion: c.into(),
            ..RewardInput::default()
        };
        assert_eq!(r.score(&input("<think>x</think> 4")), Ok(1.0));
        assert_eq!(r.score(&input("4 <think></think>")), Ok(0.0));
        let n = Named {
            name: "think".into(),
            inner: Arc::new(r),
        };
        assert_eq!(
            (n.name(), n.score(&input("<think></think>"))),
            ("think", Ok(1.0))
        );
    }
}
