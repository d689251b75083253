//! [`BySource`]: verl's default reward, the scorer chosen per row by its `data_source`.

use super::Scorer;
use crate::reward::{Reward, RewardInput};
use std::collections::BTreeMap;

/// Scores each sample with the scorer its row's `data_source` names, as verl's
/// `default_compute_score` does ([`Scorer::for_data_source`]); `sources` maps further names
/// (your own datasets) to scorers and takes precedence.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BySource {
    /// Your own `data_source` names and their scorers.
    pub sources: BTreeMap<String, Scorer>,
}

impl BySource {
    /// verl's table plus `sources`.
    pub fn new(sources: BTreeMap<String, Scorer>) -> Self {
        Self { sources }
    }

    /// The scorer for a row's metadata, or why there is none (no `data_source`, or one that
    /// neither `sources` nor verl's table knows), with the fix.
    pub fn scorer(&self, metadata: &serde_json::Value) -> Result<Scorer, String> {
        let Some(source) = metadata.get("data_source") else {
            return Err(
                "the row has no data_source column, which picks verl's scorer; add reward \
                 terms that say how to score it ([[reward]] kind = \"math_dapo\", ...)"
                    .into(),
            );
        };
        let Some(source) = source.as_str() else {
            return Err(format!("data_source must be a string, got {source}"));
        };
        self.sources
            .get(source)
            .copied()
            .or_else(|| Scorer::for_data_source(source))
            .ok_or_else(|| {
                let known: Vec<&str> = Scorer::ALL.iter().map(|s| s.as_str()).collect();
                format!(
                    "no scorer for data_source {source:?} (verl scores openai/gsm8k, \
                     lighteval/MATH, HuggingFaceH4/MATH-500, math_dapo, math, aime*, searchR1_*); \
                     name one in the term's sources: sources = {{ {source:?} = \"math_dapo\" }} \
                     (scorers: {})",
                    known.join(", ")
                )
            })
    }
}

impl Reward for BySource {
    fn name(&self) -> &str {
        "by_source"
    }

    fn score(&self, input: &RewardInput) -> Result<f64, String> {
        let scorer = self.scorer(&input.metadata)?;
        Ok(scorer.score_any(&input.completion, &input.answers()).score)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn input(source: serde_json::Value, completion: &str, answer: &str) -> RewardInput {
        RewardInput {
            completion: completion.into(),
            answer: answer.into(),
            metadata: json!({ "data_source": source }),
            ..Default::default()
        }
    }

    #[test]
    fn picks_verls_scorer_and_own_sources_first() {
        let by = BySource::default();
        // gsm8k strict needs "####"; math_dapo gives -1 when wrong.
        assert_eq!(
            by.score(&input(json!("openai/gsm8k"), "#### 4", "4")),
            Ok(1.0)
        );
        assert_eq!(by.score(&input(json!("openai/gsm8k"), "4", "4")), Ok(0.0));
        assert_eq!(
            by.score(&input(json!("aime25"), "Answer: 3", "4")),
            Ok(-1.0)
        );
        assert_eq!(
            by.score(&input(
                json!("searchR1_nq"),
                "<answer>An Apple</answer>",
                "apple"
            )),
            Ok(1.0)
        );
        let own = BySource::new([("mine".to_string(), Scorer::MathBoxed)].into());
        assert_eq!(own.score(&input(json!("mine"), r"\boxed{4}", "4")), Ok(1.0));
        let over = BySource::new([("openai/gsm8k".to_string(), Scorer::Gsm8kFlexible)].into());
        assert_eq!(over.score(&input(json!("openai/gsm8k"), "4", "4")), Ok(1.0));
    }

    #[test]
    fn unknown_or_missing_source_is_an_error_with_the_fix() {
        let by = BySource::default();
        let e = by
            .score(&input(json!("numina_olympiads"), "x", "1"))
            .unwrap_err();
        assert!(
            e.contains("\"numina_olympiads\"") && e.contains("sources = {"),
            "{e}"
        );
        let e = by.score(&input(json!(3), "x", "1")).unwrap_err();
        assert!(e.contains("must be a string"), "{e}");
        let e = by
            .score(&RewardInput {
                metadata: json!({}),
                ..Default::default()
            })
            .unwrap_err();
        assert!(
            e.contains("no data_source") && e.contains("[[reward]]"),
            "{e}"
        );
    }
}
