//! Ports of verl 0.9.1's rule-based reward scorers (`verl/utils/reward_score/`), string for
//! string: [`gsm8k()`] (strict and flexible), [`math_boxed`] (Hendrycks MATH, `\boxed{}`),
//! [`math_dapo()`] (DAPO's Minerva normalisation) and [`qa_em()`] (Search-R1 exact match),
//! their helpers in the submodules, [`Scorer`] to pick one by name (it is also a
//! [`Reward`]), and [`check_golden`] to compare them with cases scored by verl itself.
//!
//! Python semantics are kept where they matter: lengths and slices count code points,
//! whitespace is Python's `str.isspace`, and where verl raises (and catches) an exception the
//! port takes the same fallback.

/// A `&'static regex::Regex`, compiled on first use.
macro_rules! cached_regex {
    ($pattern:expr) => {{
        static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
        RE.get_or_init(|| regex::Regex::new($pattern).expect("valid regex"))
    }};
}

mod golden;
pub mod gsm8k;
pub mod math_dapo;
pub mod math_reward;
mod py;
pub mod qa_em;

pub use golden::{
    ExpectedScore, GoldenCase, ParityFailure, ParityReport, check_golden, check_golden_file,
};
pub use gsm8k::{Gsm8kMethod, gsm8k};
pub use math_dapo::{DapoScore, math_dapo};
pub use math_reward::math_boxed;
pub use qa_em::qa_em;

use crate::reward::{Reward, RewardInput};
use crate::{Result, RolloutError};

/// One of the ported scorers, by the name verl's golden cases use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scorer {
    /// `gsm8k_strict`: [`gsm8k()`] with [`Gsm8kMethod::Strict`].
    Gsm8kStrict,
    /// `gsm8k_flexible`: [`gsm8k()`] with [`Gsm8kMethod::Flexible`].
    Gsm8kFlexible,
    /// `math_boxed`: [`math_boxed`].
    MathBoxed,
    /// `math_dapo`: [`math_dapo()`] (score 1 / −1, with `acc` and `pred`).
    MathDapo,
    /// `qa_em`: [`qa_em()`] (with `pred`, the extracted answer).
    QaEm,
}

/// What a [`Scorer`] gives for one solution.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// The reward.
    pub score: f64,
    /// Whether the answer is correct, for scorers that report it ([`Scorer::MathDapo`]).
    pub acc: Option<bool>,
    /// The prediction the score is based on, for scorers that report it: [`Scorer::MathDapo`]
    /// always (possibly [`math_dapo::INVALID`]), [`Scorer::QaEm`] when there is an
    /// `<answer>…</answer>`.
    pub pred: Option<String>,
}

impl Scorer {
    /// Every scorer.
    pub const ALL: [Scorer; 5] = [
        Scorer::Gsm8kStrict,
        Scorer::Gsm8kFlexible,
        Scorer::MathBoxed,
        Scorer::MathDapo,
        Scorer::QaEm,
    ];

    /// The name (`gsm8k_strict`, `gsm8k_flexible`, `math_boxed`, `math_dapo`, `qa_em`).
    pub fn as_str(self) -> &'static str {
        match self {
            Scorer::Gsm8kStrict => "gsm8k_strict",
            Scorer::Gsm8kFlexible => "gsm8k_flexible",
            Scorer::MathBoxed => "math_boxed",
            Scorer::MathDapo => "math_dapo",
            Scorer::QaEm => "qa_em",
        }
    }

    /// Scores `solution` against `ground_truth`.
    pub fn score(self, solution: &str, ground_truth: &str) -> Scored {
        let plain = |score| Scored {
            score,
            acc: None,
            pred: None,
        };
        match self {
            Scorer::Gsm8kStrict => plain(gsm8k(solution, ground_truth, Gsm8kMethod::Strict)),
            Scorer::Gsm8kFlexible => plain(gsm8k(solution, ground_truth, Gsm8kMethod::Flexible)),
            Scorer::MathBoxed => plain(math_boxed(solution, ground_truth)),
            Scorer::MathDapo => {
                let d = math_dapo(solution, ground_truth);
                Scored {
                    score: d.score,
                    acc: Some(d.acc),
                    pred: Some(d.pred),
                }
            }
            Scorer::QaEm => {
                let pred = qa_em::extract_solution(solution);
                let correct = pred
                    .as_deref()
                    .is_some_and(|p| qa_em::em_check(p, &[ground_truth]));
                Scored {
                    score: if correct { 1.0 } else { 0.0 },
                    acc: None,
                    pred,
                }
            }
        }
    }
}

impl std::fmt::Display for Scorer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Scorer {
    type Err = RolloutError;

    /// A scorer by its name; an unknown name is an [`RolloutError::Input`] listing the known
    /// ones.
    fn from_str(s: &str) -> Result<Self> {
        Scorer::ALL
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = Scorer::ALL.iter().map(|x| x.as_str()).collect();
                RolloutError::Input(format!(
                    "unknown scorer {s:?}; expected one of {}",
                    known.join(", ")
                ))
            })
    }
}

/// The scorer as a reward term named after it: the completion against the reference answer.
impl Reward for Scorer {
    fn name(&self) -> &str {
        self.as_str()
    }
    fn score(&self, input: &RewardInput) -> Result<f64, String> {
        Ok(Scorer::score(*self, &input.completion, &input.answer).score)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in Scorer::ALL {
            assert_eq!(s.as_str().parse::<Scorer>().unwrap(), s);
            assert_eq!(s.to_string(), s.as_str());
        }
        let err = "gsm8k".parse::<Scorer>().unwrap_err().to_string();
        assert!(
            err.contains("unknown scorer \"gsm8k\"") && err.contains("qa_em"),
            "{err}"
        );
    }

    #[test]
    fn scorer_reports_acc_and_pred_where_verl_does() {
        let d = Scorer::MathDapo.score("Answer: 5", "5");
        assert_eq!(
            (d.score, d.acc, d.pred.as_deref()),
            (1.0, Some(true), Some("5"))
        );
        let q = Scorer::QaEm.score("<answer> The Paris </answer>", "paris");
        assert_eq!(
            (q.score, q.acc, q.pred.as_deref()),
            (1.0, None, Some("The Paris"))
        );
        let q = Scorer::QaEm.score("Paris", "paris");
        assert_eq!((q.score, q.pred), (0.0, None));
        let g = Scorer::Gsm8kStrict.score("#### 1,000", "1000");
        assert_eq!((g.score, g.acc, g.pred), (1.0, None, None));
        let input = RewardInput {
            completion: r"\boxed{\frac12}".into(),
            answer: "0.5".into(),
            ..Default::default()
        };
        assert_eq!(Reward::score(&Scorer::MathBoxed, &input), Ok(1.0));
        assert_eq!(Reward::name(&Scorer::MathBoxed), "math_boxed");
    }
}
