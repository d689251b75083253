//! Parity with verl: golden cases (scored by verl's own Python) run through the ports.

use super::{Scored, Scorer};
use crate::{Result, RolloutError};
use serde::Deserialize;
use std::path::Path;

/// What verl's scorer gave for a golden case. `acc` and `pred` are only compared when the case
/// has them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedScore {
    /// The score, compared exactly.
    pub score: f64,
    /// `acc`, when given.
    #[serde(default)]
    pub acc: Option<bool>,
    /// `pred`, when given: `Some(None)` for a JSON `null` (no prediction).
    #[serde(default, deserialize_with = "present")]
    pub pred: Option<Option<String>>,
}

/// A field that is there (possibly `null`), as opposed to missing (`#[serde(default)]`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

/// One line of a golden file:
/// `{"id", "scorer", "solution_str", "ground_truth", "expected": {"score", "acc"?, "pred"?}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct GoldenCase {
    /// 1-based line in the file.
    pub line: usize,
    /// The case id.
    pub id: String,
    /// Which scorer.
    pub scorer: Scorer,
    /// The solution text (`solution_str`).
    pub solution: String,
    /// The reference answer.
    pub ground_truth: String,
    /// verl's result.
    pub expected: ExpectedScore,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    id: String,
    scorer: String,
    solution_str: String,
    ground_truth: String,
    expected: ExpectedScore,
}

/// A case whose port result differs from verl's.
#[derive(Debug, Clone, PartialEq)]
pub struct ParityFailure {
    /// The case.
    pub case: GoldenCase,
    /// What the port gave.
    pub got: Scored,
}

impl ParityFailure {
    fn describe(
        expected: &ExpectedScore,
        score: f64,
        acc: Option<bool>,
        pred: Option<&str>,
    ) -> String {
        let mut out = format!("score {score:?}");
        if expected.acc.is_some() {
            match acc {
                Some(acc) => out.push_str(&format!(", acc {acc}")),
                None => out.push_str(", no acc"),
            }
        }
        if expected.pred.is_some() {
            match pred {
                Some(pred) => out.push_str(&format!(", pred {pred:?}")),
                None => out.push_str(", pred null"),
            }
        }
        out
    }
}

impl std::fmt::Display for ParityFailure {
    /// `ID (SCORER, line N): expected score 1.0, pred "x"; got score 0.0, pred null`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.case;
        let e = &c.expected;
        let want = Self::describe(
            e,
            e.score,
            e.acc,
            e.pred.as_ref().and_then(|p| p.as_deref()),
        );
        let got = Self::describe(e, self.got.score, self.got.acc, self.got.pred.as_deref());
        write!(
            f,
            "{} ({}, line {}): expected {want}; got {got}",
            c.id, c.scorer, c.line
        )
    }
}

/// The outcome of [`check_golden`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParityReport {
    /// Cases where the port agrees with verl.
    pub passed: usize,
    /// Cases where it does not, in file order.
    pub failures: Vec<ParityFailure>,
}

impl ParityReport {
    /// How many cases failed.
    pub fn failed(&self) -> usize {
        self.failures.len()
    }

    /// `N passed, M failed`.
    pub fn summary(&self) -> String {
        format!("{} passed, {} failed", self.passed, self.failed())
    }
}

/// Parses a golden file's text; `Err((line, message))` for the first unusable line.
fn parse(text: &str) -> std::result::Result<Vec<GoldenCase>, (usize, String)> {
    let mut cases = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let case: RawCase = serde_json::from_str(raw).map_err(|e| {
            let msg = e.to_string();
            let msg = msg
                .rsplit_once(" at line ")
                .map_or(msg.as_str(), |(m, _)| m);
            let what = "{\"id\", \"scorer\", \"solution_str\", \"ground_truth\", \"expected\": \
                        {\"score\", \"acc\"?, \"pred\"?}}";
            (
                line,
                format!(
                    "not a golden case ({msg}, column {}); expected {what}",
                    e.column()
                ),
            )
        })?;
        let scorer = case
            .scorer
            .parse()
            .map_err(|e: RolloutError| (line, e.to_string()))?;
        cases.push(GoldenCase {
            line,
            id: case.id,
            scorer,
            solution: case.solution_str,
            ground_truth: case.ground_truth,
            expected: case.expected,
        });
    }
    if cases.is_empty() {
        return Err((0, "no golden cases in the file".to_string()));
    }
    Ok(cases)
}

/// Whether the port's result matches verl's: `score` exactly, `acc` and `pred` where given.
fn matches(expected: &ExpectedScore, got: &Scored) -> bool {
    expected.score == got.score
        && expected.acc.is_none_or(|acc| got.acc == Some(acc))
        && expected.pred.as_ref().is_none_or(|pred| *pred == got.pred)
}

fn check(cases: Vec<GoldenCase>) -> ParityReport {
    let mut report = ParityReport::default();
    for case in cases {
        let got = case.scorer.score(&case.solution, &case.ground_truth);
        if matches(&case.expected, &got) {
            report.passed += 1;
        } else {
            report.failures.push(ParityFailure { case, got });
        }
    }
    report
}

/// Scores every case of a golden JSONL text (one case a line, blank lines skipped) with the
/// port of its scorer and compares with verl's result.
///
/// # Errors
///
/// [`RolloutError::Input`] naming the line for a line that is not a case (bad JSON, a missing
/// or unknown field, an unknown scorer), or when there are no cases at all.
pub fn check_golden(text: &str) -> Result<ParityReport> {
    parse(text)
        .map(check)
        .map_err(|(line, msg)| RolloutError::Input(format!("golden cases, line {line}: {msg}")))
}

/// [`check_golden`] on a file.
///
/// # Errors
///
/// [`RolloutError::Dataset`] with the path and line (0: the file as a whole, unreadable or
/// empty).
pub fn check_golden_file(path: impl AsRef<Path>) -> Result<ParityReport> {
    let path = path.as_ref();
    let fail = |line, msg| RolloutError::Dataset {
        path: path.to_path_buf(),
        line,
        msg,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(0, format!("cannot read: {e}")))?;
    parse(&text)
        .map(check)
        .map_err(|(line, msg)| fail(line, msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"id": "a", "scorer": "gsm8k_strict", "solution_str": "so #### 5", "ground_truth": "5", "expected": {"score": 1.0}}"#;

    #[test]
    fn passes_and_failures_are_counted() {
        let wrong = r#"{"id": "b", "scorer": "math_dapo", "solution_str": "Answer: 4", "ground_truth": "4", "expected": {"score": 1.0, "acc": true, "pred": "5"}}"#;
        let none = r#"{"id": "c", "scorer": "qa_em", "solution_str": "Paris", "ground_truth": "Paris", "expected": {"score": 0.0, "pred": null}}"#;
        let report = check_golden(&format!("{GOOD}\n\n{wrong}\n{none}\n")).unwrap();
        assert_eq!((report.passed, report.failed()), (2, 1));
        assert_eq!(report.summary(), "2 passed, 1 failed");
        let shown = report.failures[0].to_string();
        assert_eq!(
            shown,
            "b (math_dapo, line 3): expected score 1.0, acc true, pred \"5\"; got score 1.0, acc \
             true, pred \"4\""
        );
        // `pred: null` expects no prediction.
        let some = none.replace("\"Paris\", \"ground", "\"<answer>x</answer>\", \"ground");
        assert_eq!(check_golden(&some).unwrap().failed(), 1);
    }

    #[test]
    fn a_malformed_line_is_an_error_naming_it() {
        for (bad, want) in [
            ("{not json", "line 2: not a golden case"),
            (
                r#"{"id": "x", "scorer": "gsm8k_strict"}"#,
                "line 2: not a golden case (missing field",
            ),
            (
                &GOOD.replace("gsm8k_strict", "gsm9k"),
                "line 2: unknown scorer \"gsm9k\"",
            ),
            (
                &GOOD.replace("1.0", "\"1\""),
                "line 2: not a golden case (invalid type",
            ),
        ] {
            let err = check_golden(&format!("{GOOD}\n{bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{want:?} not in {err:?}");
        }
        let err = check_golden("\n\n").unwrap_err().to_string();
        assert!(err.contains("no golden cases"), "{err}");
        let err = check_golden_file("/nonexistent/cases.jsonl")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("/nonexistent/cases.jsonl:0: cannot read"),
            "{err}"
        );
    }
}
