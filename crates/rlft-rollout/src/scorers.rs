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

mod by_source;
mod golden;
pub mod gsm8k;
pub mod math_dapo;
pub mod math_reward;
mod py;
pub mod qa_em;

pub use by_source::BySource;
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
#[derive(
    schemars::JsonSchema,
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
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

    /// The scorer verl 0.9.1's `default_compute_score` picks for a `data_source`:
    /// `openai/gsm8k` → gsm8k (strict); `lighteval/MATH`, `DigitalLearningGmbH/MATH-lighteval`,
    /// `HuggingFaceH4/MATH-500` → math_boxed; `math_dapo`, `math`, `math_dapo_reasoning` and
    /// every source starting with `aime` → math_dapo; the seven `searchR1_*` sources → qa_em.
    /// `None` for the sources verl scores with code it runs elsewhere (numina's prime_math, code
    /// sandboxes, geometry3k) and for every other name.
    pub fn for_data_source(source: &str) -> Option<Scorer> {
        const SEARCH_R1: [&str; 7] = [
            "searchR1_nq",
            "searchR1_triviaqa",
            "searchR1_popqa",
            "searchR1_hotpotqa",
            "searchR1_2wikimultihopqa",
            "searchR1_musique",
            "searchR1_bamboogle",
        ];
        match source {
            "openai/gsm8k" => Some(Scorer::Gsm8kStrict),
            "lighteval/MATH" | "DigitalLearningGmbH/MATH-lighteval" | "HuggingFaceH4/MATH-500" => {
                Some(Scorer::MathBoxed)
            }
            "math_dapo" | "math" | "math_dapo_reasoning" => Some(Scorer::MathDapo),
            s if s.starts_with("aime") => Some(Scorer::MathDapo),
            s if SEARCH_R1.contains(&s) => Some(Scorer::QaEm),
            _ => None,
        }
    }

    /// Whether the scorer compares numbers (so a ground truth must parse as one).
    pub fn is_numeric(self) -> bool {
        matches!(self, Scorer::Gsm8kStrict | Scorer::Gsm8kFlexible)
    }

    /// Scores `solution` against several acceptable answers: `qa_em` as verl's Search-R1
    /// `compute_score` with a `target` list (a match with any), the others by the best score
    /// over the answers. An empty list scores as one empty answer.
    pub fn score_any(self, solution: &str, answers: &[&str]) -> Scored {
        if self == Scorer::QaEm {
            let pred = qa_em::extract_solution(solution);
            let correct = pred.as_deref().is_some_and(|p| qa_em::em_check(p, answers));
            return Scored {
                score: if correct { 1.0 } else { 0.0 },
                acc: None,
                pred,
            };
        }
        let mut best: Option<Scored> = None;
        for a in answers {
            let s = self.score(solution, a);
            if best.as_ref().is_none_or(|b| s.score > b.score) {
                best = Some(s);
            }
        }
        best.unwrap_or_else(|| self.score(solution, ""))
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
            Scorer::QaEm => self.score_any(solution, &[ground_truth]),
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

/// The scorer as a reward term named after it: the completion against the reference answers.
impl Reward for Scorer {
    fn name(&self) -> &str {
        self.as_str()
    }
    fn score(&self, input: &RewardInput) -> Result<f64, String> {
        Ok(self.score_any(&input.completion, &input.answers()).score)
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

    #[test]
    fn any_of_several_answers_counts() {
        let q = Scorer::QaEm.score_any("<answer>the Big Apple</answer>", &["NYC", "big apple"]);
        assert_eq!((q.score, q.pred.as_deref()), (1.0, Some("the Big Apple")));
        let q = Scorer::QaEm.score_any("<answer>Boston</answer>", &["NYC", "big apple"]);
        assert_eq!(q.score, 0.0);
        let d = Scorer::MathDapo.score_any("Answer: 6", &["5", "6"]);
        assert_eq!((d.score, d.acc), (1.0, Some(true)));
        let d = Scorer::MathDapo.score_any("Answer: 7", &["5", "6"]);
        assert_eq!((d.score, d.acc), (-1.0, Some(false)));
        let input = RewardInput {
            completion: "#### 12".into(),
            answer: "11".into(),
            alternatives: vec!["12".into()],
            ..Default::default()
        };
        assert_eq!(Reward::score(&Scorer::Gsm8kStrict, &input), Ok(1.0));
    }

    #[test]
    fn data_sources_map_as_in_verl() {
        for (source, want) in [
            ("openai/gsm8k", Some(Scorer::Gsm8kStrict)),
            ("lighteval/MATH", Some(Scorer::MathBoxed)),
            (
                "DigitalLearningGmbH/MATH-lighteval",
                Some(Scorer::MathBoxed),
            ),
            ("HuggingFaceH4/MATH-500", Some(Scorer::MathBoxed)),
            ("math_dapo", Some(Scorer::MathDapo)),
            ("math", Some(Scorer::MathDapo)),
            ("aime2024", Some(Scorer::MathDapo)),
            ("searchR1_nq", Some(Scorer::QaEm)),
            ("searchR1_bamboogle", Some(Scorer::QaEm)),
            ("numina_olympiads", None),
            ("hiyouga/geometry3k", None),
            ("gsm8k", None),
        ] {
            assert_eq!(Scorer::for_data_source(source), want, "{source}");
        }
    }
}
