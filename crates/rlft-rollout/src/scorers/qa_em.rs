//! Exact match for QA: verl's `verl/utils/reward_score/search_r1_like_qa_em.py` (Search-R1),
//! with SQuAD's answer normalisation.

use super::py;

/// verl's `extract_solution` (Search-R1): the text of the last `<answer>…</answer>` (the
/// regex `<answer>(.*?)</answer>` across lines, so an unclosed `<answer>` before it belongs to
/// it), whitespace-trimmed; `None` without a complete pair.
pub fn extract_solution(solution: &str) -> Option<String> {
    cached_regex!(r"(?s)<answer>(.*?)</answer>")
        .captures_iter(solution)
        .last()
        .map(|c| py::strip(&c[1]).to_string())
}

/// `a`, `an` and `the` as whole words → a space: Python's `re.sub(r"\b(a|an|the)\b", " ", …)`,
/// whose word characters (`str.isalnum()` or `_`) are exactly Unicode letters, numbers and `_`.
fn remove_articles(text: &str) -> String {
    cached_regex!(r"[\p{L}\p{N}_]+")
        .replace_all(text, |c: &regex::Captures<'_>| match &c[0] {
            "a" | "an" | "the" => " ".to_string(),
            word => word.to_string(),
        })
        .into_owned()
}

/// verl's `normalize_answer` (SQuAD): lower case, ASCII punctuation removed, the articles `a`,
/// `an`, `the` removed, whitespace runs collapsed to one space and trimmed.
pub fn normalize_answer(text: &str) -> String {
    let lower = text.to_lowercase();
    let no_punct: String = lower
        .chars()
        .filter(|c| !c.is_ascii_punctuation())
        .collect();
    let no_articles = remove_articles(&no_punct);
    no_articles
        .split(py::is_space)
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// verl's `em_check`: whether the normalised `prediction` equals some normalised golden answer.
pub fn em_check(prediction: &str, golden_answers: &[&str]) -> bool {
    let prediction = normalize_answer(prediction);
    golden_answers
        .iter()
        .any(|g| normalize_answer(g) == prediction)
}

/// verl's `em_check(extract_solution(solution), [ground_truth])`: 1 on an exact match after
/// normalisation, else 0 (0 too without an `<answer>…</answer>`). verl's `compute_score`
/// wrapper around it (quartering the score when there are more than 10 answer tags, `target`
/// lists) is not applied.
pub fn qa_em(solution: &str, ground_truth: &str) -> f64 {
    match extract_solution(solution) {
        Some(answer) if em_check(&answer, &[ground_truth]) => 1.0,
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squad_normalisation() {
        assert_eq!(normalize_answer("  The  Beatles! "), "beatles");
        assert_eq!(normalize_answer("A cat, an owl & THE dog."), "cat owl dog");
        assert_eq!(normalize_answer("theatre and anthem"), "theatre and anthem");
        assert_eq!(normalize_answer("G. Washington"), "g washington");
        assert_eq!(normalize_answer("rock'n'roll"), "rocknroll");
        // Python's word characters: a vowel sign (a mark) ends the word `a`.
        assert_eq!(normalize_answer("a\u{93f} b"), "\u{93f} b");
        assert_eq!(normalize_answer("a1 the 2 théa"), "a1 2 théa");
    }

    #[test]
    fn last_answer_tag() {
        assert_eq!(
            extract_solution("<answer>wrong</answer> then <answer>\nParis\n</answer>").as_deref(),
            Some("Paris")
        );
        assert_eq!(
            extract_solution("<answer>a <answer>b</answer>").as_deref(),
            Some("a <answer>b")
        );
        assert_eq!(extract_solution("<answer>Paris"), None);
        assert_eq!(qa_em("<answer> paris. </answer>", "Paris"), 1.0);
        assert_eq!(qa_em("<answer>The Paris</answer>", "Paris"), 1.0);
        assert_eq!(qa_em("<answer>in 1969</answer>", "1969"), 0.0);
        assert_eq!(qa_em("Paris", "Paris"), 0.0);
    }
}
