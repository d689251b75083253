//! GSM8K: verl's `verl/utils/reward_score/gsm8k.py` (the ReFT scorer).

use super::py;

/// How [`extract_solution`] finds the answer (verl's `method` argument).
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
#[serde(rename_all = "lowercase")]
pub enum Gsm8kMethod {
    /// `"strict"`: the last `#### <number>` (the GSM8K answer format), with `,` and `$` removed.
    Strict,
    /// `"flexible"`: the last run of digits, `.` and `,` (optionally after `-`) that is not a
    /// lone `.`, kept as written (commas included).
    Flexible,
}

/// How many characters from the end of a solution verl looks at (`_SOLUTION_CLIP_CHARS`).
pub const SOLUTION_CLIP_CHARS: usize = 300;

/// verl's `gsm8k.extract_solution`: the answer in the last [`SOLUTION_CLIP_CHARS`] characters
/// (code points) of `solution`, or `None` when there is none.
///
/// With [`Gsm8kMethod::Flexible`] and nothing but lone `.` candidates, verl's loop leaves `"."`
/// as the answer rather than `None`; so does this port.
pub fn extract_solution(solution: &str, method: Gsm8kMethod) -> Option<String> {
    let text = py::tail(solution, SOLUTION_CLIP_CHARS);
    match method {
        Gsm8kMethod::Strict => cached_regex!(r"#### (-?[0-9.,]+)")
            .captures_iter(text)
            .last()
            .map(|c| c[1].replace([',', '$'], "")),
        Gsm8kMethod::Flexible => {
            let found: Vec<&str> = cached_regex!(r"-?[0-9.,]+")
                .find_iter(text)
                .map(|m| m.as_str())
                .collect();
            let first = *found.first()?;
            let last_valid = found.iter().rev().find(|s| !matches!(**s, "" | "."));
            Some(last_valid.copied().unwrap_or(first).to_string())
        }
    }
}

/// verl's `gsm8k.compute_score(solution, ground_truth, method)` with its default scores
/// (`format_score` 0, `score` 1): 1 when the extracted answer is string-equal to
/// `ground_truth`, else 0 (0 too when there is no answer).
pub fn gsm8k(solution: &str, ground_truth: &str, method: Gsm8kMethod) -> f64 {
    match extract_solution(solution, method) {
        Some(answer) if answer == ground_truth => 1.0,
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Gsm8kMethod::{Flexible, Strict};

    #[test]
    fn strict_takes_the_last_marked_answer_without_separators() {
        assert_eq!(
            gsm8k("#### 74\nActually, #### 56,125", "56125", Strict),
            1.0
        );
        assert_eq!(gsm8k("#### 56125\nActually, #### 74", "56125", Strict), 0.0);
        assert_eq!(gsm8k("The answer is 72.", "72", Strict), 0.0);
        assert_eq!(gsm8k("####72", "72", Strict), 0.0, "needs the space");
        assert_eq!(gsm8k("#### -3.50", "-3.50", Strict), 1.0);
        assert_eq!(gsm8k("#### 72.0", "72", Strict), 0.0, "string equality");
    }

    #[test]
    fn flexible_keeps_commas_and_skips_lone_dots() {
        assert_eq!(gsm8k("so 1,234 apples.", "1,234", Flexible), 1.0);
        assert_eq!(gsm8k("so 1,234 apples.", "1234", Flexible), 0.0);
        assert_eq!(gsm8k("It is 42. . .", "42.", Flexible), 1.0);
        assert_eq!(
            extract_solution("just . and .", Flexible).as_deref(),
            Some(".")
        );
        assert_eq!(extract_solution("a, b", Flexible).as_deref(), Some(","));
        assert_eq!(extract_solution("no digits", Flexible), None);
    }

    #[test]
    fn only_the_last_300_characters_count() {
        let pad = "x".repeat(300);
        assert_eq!(gsm8k(&format!("#### 9 {pad}"), "9", Strict), 0.0);
        assert_eq!(gsm8k(&format!("7 {pad}"), "7", Flexible), 0.0);
        // Characters, not bytes.
        let wide = "é".repeat(294);
        assert_eq!(gsm8k(&format!("#### 9{wide}"), "9", Strict), 1.0);
    }
}
